//go:build cuda

package sched

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// gpuLane is the GPU lane the tests use (TANDEM_CUDA_DEVICE picks one).
func gpuLane() LaneSpec {
	if d := os.Getenv("TANDEM_CUDA_DEVICE"); d != "" {
		return LaneSpec{Device: "cuda:" + d}
	}
	return LaneSpec{Device: "cuda"}
}

// TestCUDALanes: a GPU lane and a CPU lane from LoadLanes (--lanes
// cuda,1) both serve requests of one scheduler, and every request
// reproduces the reference greedy tokens. FIFO serves from one queue
// shared by the lanes, and with one sequence per lane two requests at
// once keep both lanes busy. Without a GPU this binary skips
// (kernels/cuda/internal/cuinit).
func TestCUDALanes(t *testing.T) {
	f, _ := realModel(t)
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane(), {Threads: 1}}, MaxSeqs: 1, Context: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	if len(lanes) != 2 || lanes[0].Name != "cuda0" || lanes[1].Name != "cpu1" {
		t.Fatalf("lanes %+v, want cuda0 and cpu1", lanes)
	}
	s, err := New(Config{Policy: FIFO}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	recs := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[:4]
	const n = 40
	var wg sync.WaitGroup
	served := make([]int, len(recs))
	got := make([][]int32, len(recs))
	errs := make([]error, len(recs))
	for i, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := s.Submit(context.Background(), Request{Prompt: r.PromptIDs, MaxTokens: n})
			if err != nil {
				errs[i] = err
				return
			}
			for {
				ev, err := st.Recv(context.Background())
				if err != nil {
					errs[i] = err
					return
				}
				got[i] = append(got[i], ev.Tokens...)
				if ev.Done {
					served[i] = ev.Result.Lane
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, r := range recs {
		if errs[i] != nil {
			t.Fatalf("record %d: %v", i, errs[i])
		}
		want := r.GeneratedIDs[:min(n, len(r.GeneratedIDs))]
		if !slices.Equal(got[i][:min(len(got[i]), len(want))], want) || len(got[i]) < len(want) {
			t.Errorf("record %d on lane %s: %v\nwant %v", i, lanes[served[i]].Name, got[i], want)
		}
	}
	if !slices.Contains(served, 0) || !slices.Contains(served, 1) {
		t.Errorf("requests served on lanes %v; want both", served)
	}
}

// TestCUDAPrefixReuse: NewModelEngine keeps prefix reuse off on a GPU
// lane, whose rows live in device memory, until a device has run this
// test. Forced on here, a first turn and a next turn from the rows it
// left give the reference greedy tokens, the next turn prefilling one
// token. Once this passes on a GPU, the gate can admit device caches.
func TestCUDAPrefixReuse(t *testing.T) {
	f, _ := realModel(t)
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 2, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	e := lanes[0].Engine.(*ModelEngine)
	if e.reuse {
		t.Fatal("prefix reuse is on for a GPU lane: update this test's comment and README's")
	}
	e.reuse = true
	r := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[0]
	gen := r.GeneratedIDs
	if got, _, _ := decodeAlone(t, e, r.PromptIDs, len(gen)); !slices.Equal(got, gen) {
		t.Fatalf("first turn %v\nwant %v", got, gen)
	}
	turn := slices.Concat(r.PromptIDs, gen[:100])
	got, prefilled, reused := decodeAlone(t, e, turn, len(gen)-100)
	if !slices.Equal(got, gen[100:]) || reused != len(turn)-1 || prefilled != 1 {
		t.Fatalf("next turn %v with %d prefilled and %d reused\nwant %v, 1 and %d", got, prefilled, reused, gen[100:], len(turn)-1)
	}
}
