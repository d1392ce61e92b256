// Package jsonerr explains why a JSON body did not decode into a Go
// type, naming fields as the client wrote them. The HTTP API and the
// mobile bindings report bad requests through it.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"strings"
)

// Error is what is wrong with a body.
type Error struct {
	// Field is the path of the field at fault as the body spells it
	// ("utility.weight", "messages[1].role"); "" for the body as a whole.
	Field   string
	Msg     string
	Unknown bool // the field is one the type has no place for
}

func (e *Error) Error() string { return e.Msg }

// Explain explains err, which decoding data into a value of type t
// returned (with unknown fields disallowed).
func Explain(err error, data []byte, t reflect.Type) *Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return &Error{Msg: fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)}
	case errors.As(err, &typ):
		if typ.Field == "" {
			return &Error{Msg: fmt.Sprintf("want a JSON object, not %s", typ.Value)}
		}
		field := fieldPath(data, t, "", typ.Offset)
		if field == "" {
			// Go's path names the struct fields; the last one is the key.
			field = typ.Field[strings.LastIndexByte(typ.Field, '.')+1:]
		}
		if n, ok := strings.CutPrefix(typ.Value, "number "); ok {
			if whole, ok := integerSpelledOut(n, typ.Type); ok {
				return &Error{Field: field, Msg: fmt.Sprintf("field %q: %s is an integer written with a fraction or an exponent; write it as %s", field, n, whole)}
			}
			if outOfRange(n, typ.Type) {
				return &Error{Field: field, Msg: fmt.Sprintf("field %q: %s is out of range", field, n)}
			}
		}
		return &Error{Field: field, Msg: fmt.Sprintf("field %q has the wrong type: got %s, want %s", field, typ.Value, typeName(typ.Type))}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Msg: fmt.Sprintf("malformed JSON: it ends early, after %d bytes", len(data))}
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		if p := fieldPath(data, t, f, 0); p != "" {
			f = p
		}
		return &Error{Field: f, Msg: fmt.Sprintf("unknown field %q", f), Unknown: true}
	}
	return &Error{Msg: fmt.Sprintf("invalid JSON: %v", err)}
}

// outOfRange tells a JSON number that is the right kind for t but too
// large for it (1e400 for a float, 1e30 for an int) from one of the
// wrong kind (1.5 for an int).
func outOfRange(number string, t reflect.Type) bool {
	f, _, err := big.ParseFloat(number, 10, 64, big.ToNearestEven)
	if err != nil {
		return false
	}
	t = open(t)
	if t == nil {
		return false
	}
	switch {
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return true // a valid number that does not fit
	case isInteger(t):
		return f.IsInt()
	}
	return false
}

// integerSpelledOut reports whether number, which encoding/json would
// not put in the integer type t, is a whole number t holds written as
// 3.0 or 3e2 (Python's json writes floats so), and returns it plainly.
func integerSpelledOut(number string, t reflect.Type) (string, bool) {
	t = open(t)
	if t == nil || !isInteger(t) {
		return "", false
	}
	f, _, err := big.ParseFloat(number, 10, 256, big.ToNearestEven)
	if err != nil || !f.IsInt() {
		return "", false
	}
	n, _ := f.Int(nil)
	lo, hi := new(big.Int), new(big.Int).Lsh(big.NewInt(1), uint(t.Bits()))
	if t.Kind() <= reflect.Int64 { // signed
		hi.Rsh(hi, 1)
		lo.Neg(hi)
	}
	if n.Cmp(lo) < 0 || n.Cmp(hi) >= 0 {
		return "", false
	}
	return n.String(), true
}

// isInteger: reflect orders the integer kinds from Int to Uintptr.
func isInteger(t reflect.Type) bool {
	return t.Kind() >= reflect.Int && t.Kind() <= reflect.Uintptr
}

// typeName says what JSON a Go type takes.
func typeName(t reflect.Type) string {
	t = open(t)
	if t == nil {
		return "any JSON"
	}
	if isInteger(t) {
		return "an integer"
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}
