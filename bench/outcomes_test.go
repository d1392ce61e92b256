package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// TestRecordsLabelEachRequest: a run's requests become one JSON line each,
// labelled with the row's setting, with the first token timed from the
// request's arrival at the scheduler, and the deadline fields only where
// the request had a deadline.
func TestRecordsLabelEachRequest(t *testing.T) {
	at := time.Unix(100, 0)
	run := Run{Outcomes: []Outcome{
		{Req: WorkRequest{ID: "p1", Class: Planner, Arrival: 1500 * time.Millisecond, MaxTokens: 16, Deadline: 40 * time.Millisecond},
			Result: sched.Result{Reason: sched.ReasonLength, PromptTokens: 9, TotalGenerated: 16, Arrival: at, FirstToken: at.Add(5 * time.Millisecond),
				Finish: at.Add(30 * time.Millisecond), HasDeadline: true, DeadlineMet: true, Utility: 1, Lane: 1, Score: 14.5},
			Response: 30 * time.Millisecond},
		{Req: WorkRequest{ID: "s1", Class: Summary, Arrival: 2 * time.Second, MaxTokens: 192, MinTokens: 0},
			Result:   sched.Result{Reason: sched.ReasonShed, PromptTokens: 70, ShedTokens: 192, Arrival: at, Finish: at.Add(time.Second), Score: 180},
			Response: time.Second},
	}}
	row := SchedRow{Engine: "real x", Policy: "tandem", Load: 1.6, Adversarial: 0.2, Variance: "normal"}
	var buf bytes.Buffer
	if err := WriteRecords(&buf, Records(row, 2, run)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"engine": "real x", "policy": "tandem", "load": 1.6, "adversarial": 0.2, "variance": "normal", "run": 2.0,
		"id": "p1", "class": "planner", "arrival_s": 1.5, "first_token_s": 0.005, "response_s": 0.03, "prompt_tokens": 9.0,
		"generated": 16.0, "shed": 0.0, "max_tokens": 16.0, "lane": 1.0, "score": 14.5, "deadline_ms": 40.0, "deadline_met": true, "utility": 1.0}
	for k, v := range want {
		if first[k] != v {
			t.Errorf("first request's %s: %v, want %v", k, first[k], v)
		}
	}
	if first["reason"] != "length" || second["reason"] != "shed" {
		t.Errorf("reasons %v and %v, want length and shed", first["reason"], second["reason"])
	}
	if v, ok := second["first_token_s"]; !ok || v != nil {
		t.Errorf("a request without a token: first_token_s %v (present %v), want null", v, ok)
	}
	for _, k := range []string{"deadline_ms", "deadline_met"} {
		if _, ok := second[k]; ok {
			t.Errorf("a request without a deadline has %s", k)
		}
	}
}
