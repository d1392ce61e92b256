package mobile

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// FuzzInputs feeds the JSON an app passes (engine config, request,
// resume options) through everything that reads it before a model does:
// decoding, the config's checks, the request's parameters, prompt
// encoding and the scheduler's validation. None may panic, and every
// refusal says what is wrong.
func FuzzInputs(f *testing.F) {
	tok, err := tokenizer.Load(testutil.Model(f, "tok512.bin"))
	if err != nil {
		f.Fatal(err)
	}
	e := &Engine{tok: tok, maxTokens: 256}
	f.Add(`{"threads": 2, "lanes": [3, 1], "budget": "512MiB", "context": 256}`, `{"prompt": "Once upon a time", "max_tokens": 8, "stop": ["."], "segment": {"regex": "[.!?]"}}`, `{"deadline_ms": 500, "max_tokens": 4}`)
	f.Add(`{"draft": "default", "mode": "sd", "kv_type": "f16", "policy": "fifo"}`, `{"prompt": "x", "min_tokens": 0, "segment": null, "utility": {"value": 1}}`, ``)
	f.Add(`null`, `{"prompt": "\u0000\ud800", "temperature": 1e400}`, `[1]`)
	f.Fuzz(func(t *testing.T, cfgJSON, reqJSON, resumeJSON string) {
		var c config
		if err := decodeJSON(cfgJSON, &c, "config"); err == nil {
			if err := c.check(); err != nil && err.Error() == "" {
				t.Fatal("a config refused without a reason")
			}
		} else if !strings.HasPrefix(err.Error(), "mobile: config: ") || len(err.Error()) == len("mobile: config: ") {
			t.Fatalf("config error %q", err)
		}
		var r request
		if err := decodeJSON(reqJSON, &r, "request"); err == nil {
			if req, err := e.schedRequest(&r); err == nil {
				if err := req.Validate(); err != nil && err.Error() == "" {
					t.Fatal("a request refused without a reason")
				}
			} else if err.Error() == "" {
				t.Fatal("a request refused without a reason")
			}
		}
		var rp sched.ResumeParams
		if err := decodeJSON(resumeJSON, &rp, "resume options"); err == nil {
			if _, err := rp.Options(); err != nil && err.Error() == "" {
				t.Fatal("resume options refused without a reason")
			}
		}
	})
}
