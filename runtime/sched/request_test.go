package sched

import (
	"slices"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

func FuzzSegmentCut(f *testing.F) {
	f.Add("go left\nthen right. Stop!", `\.\s`)
	f.Add("", "x")
	f.Fuzz(func(t *testing.T, text, expr string) {
		segs := []*Segmenter{{kind: SegmentLine}, {kind: SegmentStatement}}
		if re, err := NewRegexSegmenter(expr); err == nil {
			segs = append(segs, re)
		}
		for _, s := range segs {
			if c := s.Cut(text); c != -1 && (c <= 0 || c > len(text)) {
				t.Fatalf("%v.Cut(%q) = %d, outside 1..%d", s, text, c, len(text))
			}
		}
	})
}

func TestUtilityFunction(t *testing.T) {
	rel := 2 * time.Second
	for _, tc := range []struct {
		u    Utility
		late time.Duration
		want float64
	}{
		{Utility{}, -time.Second, 1},
		{Utility{}, 0, 1},
		{Utility{}, time.Second, 0.5}, // default slope: falls to 0 one deadline late
		{Utility{}, 5 * time.Second, 0},
		{Utility{Value: 3, Slope: 1}, time.Second, 2},
		{Utility{Value: 3, Slope: 1}, 10 * time.Second, 0},
	} {
		if got := tc.u.At(tc.late, rel); got != tc.want {
			t.Errorf("%+v at %v late: %v, want %v", tc.u, tc.late, got, tc.want)
		}
	}
}

func TestUtilityWindow(t *testing.T) {
	// How long after its deadline a request still earns utility, which
	// keeps it ahead of requests with nothing at stake (stake).
	rel := 2 * time.Second
	for _, tc := range []struct {
		u    Utility
		want time.Duration
	}{
		{Utility{}, rel}, // default slope: gone one deadline late
		{Utility{Value: 3, Slope: 1}, 3 * time.Second},
		{Utility{Value: 1, Slope: 1e-300}, MaxDeadline}, // a day at most, not an overflow
		{Utility{Value: 1e300, Slope: 1}, MaxDeadline},
	} {
		if got := tc.u.window(rel); got != tc.want {
			t.Errorf("%+v: window %v, want %v", tc.u, got, tc.want)
		}
		// Just inside the window it is worth something; at its end, nothing.
		if w := tc.u.window(rel); w < MaxDeadline && (tc.u.At(w-time.Millisecond, rel) <= 0 || tc.u.At(w, rel) != 0) {
			t.Errorf("%+v: utility %v just inside the window, %v at its end", tc.u, tc.u.At(w-time.Millisecond, rel), tc.u.At(w, rel))
		}
	}
}

func TestSetTextPrompt(t *testing.T) {
	_, tok := realModel(t)
	var r Request
	if err := r.SetTextPrompt(tok, "Once upon a time"); err != nil {
		t.Fatal(err)
	}
	want, err := tok.Encode("Once upon a time", tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Prompt, want) || r.Text != "Once upon a time" || !slices.Contains(r.StopTokens, tok.EOS()) || !slices.Contains(r.StopTokens, tok.BOS()) {
		t.Errorf("request %+v", r)
	}
	// Primed: the next word keeps its leading space.
	full, err := tok.Encode("Once upon a time there", tokenizer.EncodeOptions{AddBOS: true})
	if err != nil || !slices.Equal(full[:len(want)], want) {
		t.Fatalf("%v: %v does not extend the prompt %v", err, full, want)
	}
	var got string
	for _, id := range full[len(want):] {
		got += r.Decoder.Next(id)
	}
	if got != " there" {
		t.Errorf("decoder after the prompt gave %q, want %q", got, " there")
	}
}
