package jsonerr

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Types shaped like the API's requests: an embedded struct, a pointer to
// a nested one, an array of objects, and fields that take any JSON.
type (
	params struct {
		MaxTokens   *int     `json:"max_tokens"`
		Temperature *float64 `json:"temperature"`
		Utility     *utility `json:"utility"`
	}
	utility struct {
		Value *float64 `json:"value"`
		Slope *float64 `json:"slope"`
	}
	message struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	request struct {
		params
		Prompt    json.RawMessage `json:"prompt"`
		Messages  []message       `json:"messages"`
		LogitBias map[string]any  `json:"logit_bias"`
		Count     uint8           `json:"count"`
		Ignored   string          `json:"-"`
	}
)

// explain decodes body as the server does and explains its error.
func explain(t *testing.T, body string) *Error {
	t.Helper()
	var v request
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&v)
	if err == nil {
		t.Fatalf("%s decoded without error", body)
	}
	return Explain(err, []byte(body), reflect.TypeOf(&v))
}

func TestFieldsAreNamedByTheirPathInTheBody(t *testing.T) {
	for _, tc := range []struct {
		body, field string
		unknown     bool
	}{
		// Unknown keys, through embedded structs, pointers and arrays.
		{`{"prompt":"x","utility":{"value":1,"weight":1}}`, "utility.weight", true},
		{`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b","Weight":2}]}`, "messages[1].Weight", true},
		// Keys match fields as encoding/json matches them, case aside,
		// so an unknown key is not confused with a known one.
		{`{"PROMPT":"x","Utility":{"Value":1},"weight":1}`, "weight", true},
		// A field tagged "-" takes nothing.
		{`{"Ignored":"x"}`, "Ignored", true},
		// Inside fields that take any JSON nothing is unknown: the
		// unknown key is the top-level one after them.
		{`{"prompt":{"weight":1},"logit_bias":{"weight":1},"weight":1}`, "weight", true},
		// Wrong types, with the index encoding/json leaves out.
		{`{"messages":[{"role":"user"},{"role":"user"},{"role":true}]}`, "messages[2].role", false},
		{`{"prompt":"x","utility":{"value":"high"}}`, "utility.value", false},
		{`{"max_tokens":[1]}`, "max_tokens", false},
		{`{"max_tokens":{"a":1}}`, "max_tokens", false},
	} {
		e := explain(t, tc.body)
		if e.Field != tc.field || e.Unknown != tc.unknown || !strings.Contains(e.Msg, `"`+tc.field+`"`) {
			t.Errorf("%s: field %q (unknown %v): %q; want %q (unknown %v) named", tc.body, e.Field, e.Unknown, e.Msg, tc.field, tc.unknown)
		}
	}
}

func TestMessagesSayWhatIsWrong(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"temperature":1e400}`, `field "temperature": 1e400 is out of range`},
		{`{"max_tokens":1e30}`, `field "max_tokens": 1e30 is out of range`},
		{`{"max_tokens":99999999999999999999}`, "is out of range"},
		{`{"count":-1}`, `field "count": -1 is out of range`},
		{`{"count":300}`, "is out of range"},
		{`{"max_tokens":1.5}`, `field "max_tokens" has the wrong type: got number 1.5, want an integer`},
		{`{"max_tokens":3.0}`, `field "max_tokens": 3.0 is an integer written with a fraction or an exponent; write it as 3`},
		{`{"max_tokens":2e2}`, "write it as 200"},
		{`{"count":2.55e2}`, "write it as 255"},
		{`{"count":2.56e2}`, "is out of range"},
		{`{"count":-1.0}`, "is out of range"},
		{`{"max_tokens":2.5e-3}`, "want an integer"},
		{`{"max_tokens":"ten"}`, "got string, want an integer"},
		{`{"temperature":true}`, "got bool, want a number"},
		{`{"utility":[1]}`, "got array, want an object"},
		{`{"messages":{}}`, "got object, want an array"},
		{`{"messages":[{"role":1}]}`, "got number, want a string"},
		{`[1,2]`, "want a JSON object, not array"},
		{`{"prompt": "x"`, "ends early"},
		{`{"prompt": x}`, "malformed JSON at byte"},
		{`{"weight":1}`, `unknown field "weight"`},
	} {
		if e := explain(t, tc.body); !strings.Contains(e.Msg, tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.body, e.Msg, tc.want)
		}
	}
}

// fieldPath must stop on what the decoder rejects for other reasons:
// truncated and malformed bodies once made it loop.
func FuzzFieldPath(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","x":1}]}`), "x", int64(0))
	f.Add([]byte(`{"prompt":"x","utility":{"value":"s"}}`), "", int64(37))
	f.Add([]byte(`[{"a":[1,{"b":2}]}`), "b", int64(9))
	f.Add([]byte(`{"Prompt":"x","utility":{"value":1,"value":2}}`), "", int64(0))
	typ := reflect.TypeFor[request]()
	f.Fuzz(func(t *testing.T, data []byte, unknown string, offset int64) {
		p := fieldPath(data, typ, unknown, offset)
		if unknown != "" && offset == 0 && p != "" && !strings.HasSuffix(p, unknown) {
			t.Fatalf("path %q for unknown %q", p, unknown)
		}
		// Strict walks the same way and must end on any body too.
		if e := Strict(data, typ); e != nil && (e.Field == "" || !strings.Contains(e.Msg, e.Field)) {
			t.Fatalf("Strict: %+v", e)
		}
	})
}

// TestStrict: keys encoding/json takes in another case than the field's
// name, at any depth, and keys repeated in their object are found; keys
// inside fields that take any JSON keep their case, and a body without
// either passes.
func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		body, field, msg string
	}{
		{`{"PROMPT":"x"}`, "PROMPT", `did you mean "prompt"?`},
		{`{"prompt":"x","Max_Tokens":3}`, "Max_Tokens", `did you mean "max_tokens"?`},
		{`{"utility":{"Value":1}}`, "utility.Value", `did you mean "value"?`},
		{`{"messages":[{"role":"user"},{"ROLE":"user"}]}`, "messages[1].ROLE", `did you mean "role"?`},
		{`{"max_tokens":3,"max_tokens":4}`, "max_tokens", "appears twice"},
		{`{"utility":{"value":1,"value":2}}`, "utility.value", "appears twice"},
		{`{"logit_bias":{"7":1,"7":2}}`, "logit_bias.7", "appears twice"},
		{`{"prompt":"x","max_tokens":3,"MAX_TOKENS":4}`, "MAX_TOKENS", `did you mean "max_tokens"?`},
		{`{"prompt":{"Anything":1},"logit_bias":{"Key":1},"messages":[{"role":"user","content":{"TYPE":1}}]}`, "", ""},
		{`{"prompt":"x","max_tokens":3,"utility":{"value":1,"slope":2}}`, "", ""},
	} {
		var v request
		if err := json.Unmarshal([]byte(tc.body), &v); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		e := Strict([]byte(tc.body), reflect.TypeOf(&v))
		switch {
		case tc.field == "" && e != nil:
			t.Errorf("%s: %+v, want nothing found", tc.body, e)
		case tc.field != "" && (e == nil || e.Field != tc.field || !strings.Contains(e.Msg, tc.msg) || e.Unknown != strings.Contains(tc.msg, "did you mean")):
			t.Errorf("%s: %+v, want field %q and a message saying %q (unknown only for another case)", tc.body, e, tc.field, tc.msg)
		}
	}
}
