package sched

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestParamsApply: every field lands in the request, defaults fill the
// rest, and each bad value is a FieldError naming its field.
func TestParamsApply(t *testing.T) {
	var p Params
	if err := json.Unmarshal([]byte(`{"max_tokens": 9, "min_tokens": 2, "temperature": 0, "top_p": 0.9, "top_k": 40,
		"min_p": 0.05, "repeat_penalty": 1.1, "seed": 7, "deadline_ms": 250, "priority": -3, "segment": "line"}`), &p); err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := p.Apply(&req, 100); err != nil {
		t.Fatal(err)
	}
	s := req.Sampling
	if req.MaxTokens != 9 || req.MinTokens != 2 || s.Temperature != 0 || s.TopP != 0.9 || s.TopK != 40 || s.MinP != 0.05 ||
		s.RepeatPenalty != 1.1 || s.Seed != 7 || req.Deadline != 250*time.Millisecond || req.Priority != -3 || req.Segment == nil {
		t.Errorf("request %+v", req)
	}
	req = Request{}
	req.Sampling.Seed = 42
	if err := (&Params{}).Apply(&req, 100); err != nil || req.MaxTokens != 100 || req.Sampling.Temperature != DefaultTemperature || req.Sampling.Seed != 42 {
		t.Errorf("defaults: %v, %+v", err, req)
	}
	// null is no value, for segment as for the other fields; a mandatory
	// part of 0 is one token (0 would make every token mandatory).
	req = Request{}
	var pn Params
	if err := json.Unmarshal([]byte(`{"segment": null, "temperature": null, "min_tokens": 0}`), &pn); err != nil {
		t.Fatal(err)
	}
	if err := pn.Apply(&req, 100); err != nil || req.Segment != nil || req.MinTokens != 1 {
		t.Errorf("nulls and min_tokens 0: %v, segment %v, min tokens %d; want no segment and 1", err, req.Segment, req.MinTokens)
	}
	for _, tc := range []struct{ json, field string }{
		{`{"max_tokens": 0}`, "max_tokens"},
		{`{"max_tokens": 4, "min_tokens": 5}`, "min_tokens"},
		{`{"temperature": 2.5}`, "temperature"},
		{`{"top_p": 0}`, "top_p"},
		{`{"top_k": -1}`, "top_k"},
		{`{"min_p": 1}`, "min_p"},
		{`{"repeat_penalty": 0}`, "repeat_penalty"},
		{`{"repeat_penalty": 1e-39}`, "repeat_penalty"}, // overflowed a repeated token's logit to +Inf
		{`{"deadline_ms": 1e15}`, "deadline_ms"},
		{`{"priority": 11}`, "priority"},
		{`{"segment": "paragraph"}`, "segment"},
		{`{"segment": {"re": "x"}}`, "segment"},
		{`{"segment": {"regex": "a*"}}`, "segment.regex"},
	} {
		var p Params
		if err := json.Unmarshal([]byte(tc.json), &p); err != nil {
			t.Fatal(err)
		}
		err := p.Apply(&Request{}, 100)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, ErrInvalid) || !strings.Contains(fe.Msg, strings.Split(tc.field, ".")[0]) {
			t.Errorf("%s: %v (%#v), want a FieldError for %s", tc.json, err, fe, tc.field)
		}
	}
}

func TestTinyTopPKeepsTheTopToken(t *testing.T) {
	// Rounded to float32 1e-46 is 0, which the sampler reads as top-p off.
	top := 1e-46
	var req Request
	if err := (&Params{TopP: &top}).Apply(&req, 16); err != nil || !(req.Sampling.TopP > 0) {
		t.Errorf("top_p=%v: %v, sampler's top-p %v; want a positive mass", top, err, req.Sampling.TopP)
	}
}

func TestTinyDeadlineStaysADeadline(t *testing.T) {
	// Below a nanosecond it rounds up: zero would mean no deadline.
	ms := 1e-7
	var req Request
	if err := (&Params{DeadlineMs: &ms}).Apply(&req, 16); err != nil || req.Deadline != time.Nanosecond {
		t.Errorf("deadline_ms=%v: %v, deadline %v; want 1ns", ms, err, req.Deadline)
	}
}

func TestResumeParams(t *testing.T) {
	d, m := 1500.0, 3
	opt, err := (&ResumeParams{DeadlineMs: &d, MaxTokens: &m}).Options()
	if err != nil || opt.Deadline != 1500*time.Millisecond || opt.MaxTokens != 3 {
		t.Errorf("%+v, %v", opt, err)
	}
	d, m = 0, 1
	if _, err := (&ResumeParams{DeadlineMs: &d}).Options(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "deadline_ms=0") {
		t.Errorf("deadline 0: %v", err)
	}
	m = 0
	if _, err := (&ResumeParams{MaxTokens: &m}).Options(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "max_tokens=0") {
		t.Errorf("max_tokens 0: %v", err)
	}
}
