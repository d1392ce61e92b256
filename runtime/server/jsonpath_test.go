package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// decodeError decodes body as the server does and returns its error.
func decodeError(t *testing.T, body string, v any) *apiError {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		t.Fatalf("%s decoded without error", body)
	}
	return jsonError(err, []byte(body), reflect.TypeOf(v))
}

func TestErrorsNameNestedFields(t *testing.T) {
	for _, tc := range []struct {
		body, param string
		v           any
	}{
		// Unknown keys, through embedded structs, pointers and arrays.
		{`{"prompt":"x","utility":{"value":1,"weight":1}}`, "utility.weight", &completionRequest{}},
		{`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b","Weight":2}]}`, "messages[1].Weight", &chatRequest{}},
		{`{"stream_options":{"include_usage":true,"every":1},"messages":[]}`, "stream_options.every", &chatRequest{}},
		// Keys match fields as encoding/json matches them, case aside,
		// so an unknown key is not confused with a known one.
		{`{"PROMPT":"x","Utility":{"Value":1},"weight":1}`, "weight", &completionRequest{}},
		// Inside fields that take any JSON, nothing is unknown: the
		// unknown key is the top-level one after them.
		{`{"prompt":{"weight":1},"logit_bias":{"weight":1},"weight":1}`, "weight", &completionRequest{}},
		// Wrong types, with the index the decoder leaves out.
		{`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":true}]}`, "messages[2].role", &chatRequest{}},
		{`{"prompt":"x","utility":{"value":"high"}}`, "utility.value", &completionRequest{}},
		{`{"prompt":"x","max_tokens":[1]}`, "max_tokens", &completionRequest{}},
	} {
		e := decodeError(t, tc.body, tc.v)
		if e.Param == nil || *e.Param != tc.param {
			t.Errorf("%s: param %v, want %q (%s)", tc.body, e.Param, tc.param, e.Message)
		}
		if !strings.Contains(e.Message, tc.param) {
			t.Errorf("%s: message %q does not name %q", tc.body, e.Message, tc.param)
		}
	}
}

func TestNumberErrorsSayWhy(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"prompt":"x","temperature":1e400}`, `field "temperature": 1e400 is out of range`},
		{`{"prompt":"x","max_tokens":1e30}`, `field "max_tokens": 1e30 is out of range`},
		{`{"prompt":"x","max_tokens":99999999999999999999}`, "is out of range"},
		{`{"prompt":"x","max_tokens":1.5}`, "got number 1.5, want an integer"},
		{`{"prompt":"x","max_tokens":2.5e-3}`, "want an integer"},
		{`{"prompt":"x","max_tokens":"ten"}`, "got string, want an integer"},
	} {
		e := decodeError(t, tc.body, &completionRequest{})
		if !strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.body, e.Message, tc.want)
		}
	}
}

// fieldPath must not fail on what the decoder rejects for other reasons.
func FuzzFieldPath(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","x":1}]}`), "x", int64(0))
	f.Add([]byte(`{"prompt":"x","utility":{"value":"s"}}`), "", int64(37))
	f.Add([]byte(`[{"a":[1,{"b":2}]}`), "b", int64(9))
	f.Fuzz(func(t *testing.T, data []byte, unknown string, offset int64) {
		for _, v := range []any{&chatRequest{}, &completionRequest{}, &resumeRequest{}} {
			p := fieldPath(data, reflect.TypeOf(v), unknown, offset)
			if unknown != "" && offset == 0 && p != "" && !strings.HasSuffix(p, unknown) {
				t.Fatalf("path %q for unknown %q", p, unknown)
			}
		}
	})
}
