package sched

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// TestCPULanesStreamed: lanes whose weights stream under the smallest
// budget give the resident model's greedy tokens, each lane with its own
// streamer.
func TestCPULanesStreamed(t *testing.T) {
	f, tok := realModel(t)
	opt := weights.StreamOptions{Mode: weights.StreamPipelined}
	probe, _, err := model.PlanStream(f, opt)
	if probe.Min == 0 {
		t.Fatalf("no minimum budget: %v", err)
	}
	opt.Budget = probe.Min
	lanes, closeLanes, err := CPULanes(f, CPULaneOptions{Threads: []int{1, 1}, MaxSeqs: 2, Context: 256, Stream: &opt})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	if len(lanes) != 2 || lanes[0].Name != "cpu0" || lanes[1].Name != "cpu1" {
		t.Fatalf("lanes %+v", lanes)
	}
	s, err := New(Config{}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	const n = 12
	ids := encode(t, tok, testPrompts[1])
	want := reference(t, loadModel(t, f), ids, n)
	st, err := s.Submit(context.Background(), Request{Prompt: ids, MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for {
		ev, err := st.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Tokens...)
		if ev.Done {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("streamed lanes: %v\nresident: %v", got, want)
	}
}

func TestCPULanesErrors(t *testing.T) {
	f, _ := realModel(t)
	for _, tc := range []struct {
		name string
		opt  CPULaneOptions
		want string
	}{
		{"no lanes", CPULaneOptions{}, "no lanes"},
		{"budget below the minimum", CPULaneOptions{Threads: []int{1}, Stream: &weights.StreamOptions{Mode: weights.StreamPipelined, Budget: 1}}, "lane cpu0"},
		{"bad kv type", CPULaneOptions{Threads: []int{1}, KVType: weights.Q4_0}, "engine cpu0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lanes, closeLanes, err := CPULanes(f, tc.opt)
			if err == nil {
				closeLanes()
				t.Fatalf("accepted: %d lanes", len(lanes))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
