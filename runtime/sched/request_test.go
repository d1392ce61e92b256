package sched

import (
	"testing"
	"time"
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
