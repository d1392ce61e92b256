package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// fuzzRoutes are the endpoints that parse a request body. The resume
// route gets a real parked sequence to resume, so its body reaches the
// scheduler rather than stopping at "no such id".
var fuzzRoutes = []string{"/v1/completions", "/v1/chat/completions", "/v1/resume/"}

// FuzzRequests sends arbitrary bodies to the real server on stories260K.
// Whatever the body, the answer is a completion (plain or streamed to
// [DONE]) or an OpenAI-style error with a 4xx status, never a 5xx or a
// panic, and every sequence it started is freed afterwards.
func FuzzRequests(f *testing.F) {
	for _, seed := range []struct {
		route uint8
		body  string
	}{
		{0, `{"prompt":"Once upon a time","max_tokens":8,"temperature":0}`},
		{0, `{"prompt":[1,403,9],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`},
		{0, `{"prompt":"Tom ran","max_tokens":40,"segment":"statement","deadline_ms":5000,"min_tokens":2,"priority":3,"utility":{"value":2,"slope":0.5}}`},
		{0, `{"prompt":"x","max_tokens":3,"stop":["\n","."],"seed":7,"temperature":0.8,"top_p":0.9}`},
		{0, `{"prompt": "x"`},
		{0, `{"prompt":"x","max_tokens":"ten"}`},
		{0, `{"prompt":"x","segment":{"regex":"a*"}}`},
		{0, `{"prompt":"x","deadline_ms":1e15}`},
		{1, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":6}`},
		{1, `{"messages":[{"role":"user","content":[{"type":"text","text":"Bye"}]}],"max_completion_tokens":4,"stream":true}`},
		{1, `{"messages":[{"role":"robot","content":"x"}]}`},
		{2, `{"deadline_ms":5000,"max_tokens":6}`},
		{2, `{"stream":true}`},
		{2, `{"deadline_ms":-1}`},
		{2, ``},
	} {
		f.Add(seed.route, seed.body)
	}
	fx := newFixture(f, fixtureOpts{})
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := fuzzRoutes[int(route)%len(fuzzRoutes)]
		// Whatever happens below, discard what is parked and check that
		// nothing stays live, so one failure does not spill into the next.
		var parked []string
		defer func() {
			for _, id := range parked {
				req, _ := http.NewRequest(http.MethodDelete, fx.http.URL+"/v1/resume/"+id, nil)
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("discarding %s: %v", id, err)
					continue
				}
				r.Body.Close()
				// A refused resume leaves its sequence parked; a finished
				// one is gone (404).
				if r.StatusCode != http.StatusOK && r.StatusCode != http.StatusNotFound {
					t.Errorf("discarding %s: status %d", id, r.StatusCode)
				}
			}
			waitUntil(t, "every sequence freed", func() bool { return fx.live() == 0 })
		}()
		if path == "/v1/resume/" {
			_, _, first := post(t, fx.http.URL+"/v1/completions",
				`{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"segment":"statement"}`)
			c := parse(t, first)
			if c.Tandem == nil || !c.Tandem.Resumable {
				t.Fatalf("the first statement did not park: %s", first)
			}
			parked = append(parked, c.Tandem.ID)
			path += c.Tandem.ID
		}
		resp, err := http.Post(fx.http.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == "text/event-stream":
			chunks, done := sse(t, resp.Body)
			if !done {
				t.Fatalf("stream for %q did not end with [DONE]", body)
			}
			for _, c := range chunks {
				if c.Tandem != nil && c.Tandem.Resumable {
					parked = append(parked, c.Tandem.ID)
				}
			}
		case resp.StatusCode == http.StatusOK:
			var c completion
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Fatalf("200 for %q with a body that is not JSON: %v", body, err)
			}
			if len(c.Choices) != 1 || c.Tandem == nil || c.Usage == nil ||
				c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
				t.Fatalf("200 for %q: %+v", body, c)
			}
			if c.Tandem.Resumable {
				parked = append(parked, c.Tandem.ID)
			}
		case resp.StatusCode >= 400 && resp.StatusCode < 500:
			var c completion
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || c.Error == nil ||
				c.Error.Message == "" || c.Error.Type == "" {
				t.Fatalf("%d for %q without an OpenAI-style error body (%v)", resp.StatusCode, body, err)
			}
		default:
			t.Fatalf("status %d for %q", resp.StatusCode, body)
		}
	})
}
