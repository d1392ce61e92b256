package jsonerr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// encoding/json names an unknown field without saying where it is
// ("foo" for utility.foo) and a wrongly typed one by Go's field path,
// with embedded structs and without array indices ("Params.messages.role").
// fieldPath finds the place again by walking the body beside the type it
// was decoded into, so errors can name fields as a client wrote them:
// "utility.foo", "messages[1].role".

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// fieldPath returns the path of the first key in data that t has no
// field for and that is called unknown (when unknown is not ""), or of
// the value that ends at byte offset (when offset > 0). It returns ""
// when data does not lead there.
func fieldPath(data []byte, t reflect.Type, unknown string, offset int64) string {
	w := pathWalker{dec: json.NewDecoder(bytes.NewReader(data)), unknown: unknown, offset: offset}
	path, _ := w.value(t, "")
	return path
}

type pathWalker struct {
	dec     *json.Decoder
	unknown string
	offset  int64
	broken  bool // the body is malformed: stop
	// strict looks for keys encoding/json takes that a client did not
	// mean: another case than the field's name, or a key repeated in its
	// object. msg says what the path found is.
	strict  bool
	msg     string
	miscase bool // the key found differs from its field's name in case
}

// Strict returns the first key in data, a body that decodes into t, that
// encoding/json matched to a field though its case differs from the
// field's name ("PROMPT" for prompt: JSON names are case-sensitive, and
// OpenAI's API refuses it as unknown), or that repeats in its object
// (encoding/json keeps the last, so one of them is silently lost); nil
// when there is none.
func Strict(data []byte, t reflect.Type) *Error {
	w := pathWalker{dec: json.NewDecoder(bytes.NewReader(data)), strict: true}
	if path, found := w.value(t, ""); found {
		return &Error{Field: path, Msg: w.msg, Unknown: w.miscase}
	}
	return nil
}

// value reads one JSON value that decodes into t (nil: anything) and
// reports the path it finds there, if any.
func (w *pathWalker) value(t reflect.Type, path string) (string, bool) {
	tok, err := w.dec.Token()
	if err != nil {
		w.broken = true
		return "", false
	}
	if w.offset > 0 && w.dec.InputOffset() == w.offset {
		return path, true
	}
	t = open(t)
	switch tok {
	case json.Delim('{'):
		var seen map[string]bool
		for !w.broken && w.dec.More() {
			k, err := w.dec.Token()
			key, ok := k.(string)
			if err != nil || !ok {
				w.broken = true
				return "", false
			}
			sub := key
			if path != "" {
				sub = path + "." + key
			}
			ft, name, known := fieldType(t, key)
			if !known && w.unknown != "" && key == w.unknown {
				return sub, true
			}
			if w.strict {
				if seen[key] {
					w.msg = fmt.Sprintf("field %q appears twice in its object; send it once", sub)
					return sub, true
				}
				if seen == nil {
					seen = map[string]bool{}
				}
				seen[key] = true
				if known && name != "" && name != key {
					w.msg = fmt.Sprintf("unknown field %q: field names are case-sensitive (did you mean %q?)", sub, name)
					w.miscase = true
					return sub, true
				}
			}
			if p, found := w.value(ft, sub); found {
				return p, true
			}
		}
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; !w.broken && w.dec.More(); i++ {
			if p, found := w.value(elem, fmt.Sprintf("%s[%d]", path, i)); found {
				return p, true
			}
		}
	default:
		return "", false
	}
	w.dec.Token() // the closing delimiter
	return "", false
}

// open strips pointers and returns nil for types that take any JSON
// (raw messages, maps, interfaces): nothing inside them is unknown.
func open(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t == rawMessageType || t.Kind() == reflect.Map || t.Kind() == reflect.Interface {
		return nil
	}
	return t
}

// fieldType finds the field key decodes into, matching as encoding/json
// does: by tag name or Go name, case-insensitively, through embedded
// structs, and returns the field's name. A t that is not a struct knows
// every key (and names none).
func fieldType(t reflect.Type, key string) (reflect.Type, string, bool) {
	if t == nil || t.Kind() != reflect.Struct {
		return nil, "", t == nil
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if f.Anonymous && tag == "" {
			if ft, name, ok := fieldType(open(f.Type), key); ok && ft != nil {
				return ft, name, true
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		name := tag
		if name == "" {
			name = f.Name
		}
		if strings.EqualFold(name, key) {
			return f.Type, name, true
		}
	}
	return nil, "", false
}
