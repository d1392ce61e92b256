//go:build cuda

package sched

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
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

// TestCUDAPrefixReuse: a GPU lane, whose rows live in device memory,
// keeps a finished request's rows there, and a next turn prefills only
// the one token past them; first and next turn give the reference
// greedy tokens; the prompt again starts from a device copy of the
// prompt's rows, leaving the conversation kept, and TrimKV gives the
// device memory back. A speculative GPU lane
// (llama2xs drafting for stories260K, both on the device) does the same
// with both caches.
func TestCUDAPrefixReuse(t *testing.T) {
	f, _ := realModel(t)
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 2, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	e := lanes[0].Engine.(*ModelEngine)
	if e.cache.Config().Rows == nil {
		t.Fatal("the GPU lane's cache holds its rows in host memory")
	}
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
	if held, want := e.KVBytesHeld(), e.cache.Config().SeqBytes(); held != want {
		t.Errorf("%d KV bytes held after two turns one at a time, want one sequence's %d", held, want)
	}
	// The prompt again leaves the conversation kept: a new sequence takes
	// a device copy of the prompt's rows (kv.RowCopier on the GPU).
	if !e.cache.CanCopy() {
		t.Fatal("the GPU lane's cache cannot copy rows between sequences")
	}
	got, prefilled, reused = decodeAlone(t, e, r.PromptIDs, 50)
	if !slices.Equal(got, gen[:50]) || reused != len(r.PromptIDs)-1 || prefilled != 1 {
		t.Fatalf("prompt again %v with %d prefilled and %d reused\nwant %v, 1 and %d", got, prefilled, reused, gen[:50], len(r.PromptIDs)-1)
	}
	if held, want := e.KVBytesHeld(), 2*e.cache.Config().SeqBytes(); held != want {
		t.Errorf("%d KV bytes held after the prompt again, want two sequences' %d", held, want)
	}
	// TrimKV frees the kept sequences' device buffers (kv.RowReleaser),
	// and the lane goes on.
	if n, err := e.TrimKV(); err != nil || n != 2*e.cache.Config().SeqBytes() || e.KVBytesHeld() != 0 {
		t.Fatalf("TrimKV: %d bytes released (%v), %d held", n, err, e.KVBytesHeld())
	}
	if got, _, reused := decodeAlone(t, e, turn, 20); !slices.Equal(got, gen[100:120]) || reused != 0 {
		t.Fatalf("after TrimKV %v with %d reused, want %v with none", got, reused, gen[100:120])
	}

	// The speculative lane twice, with reuse and without: the same next
	// turn must take the same target passes and accept the same draft
	// tokens, so the draft's reused rows are right too.
	draft, err := weights.Open(testutil.Model(t, "llama2xs_model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer draft.Close()
	rec := greedyRecords(t, 120)[0]
	sturn := slices.Concat(rec.PromptIDs, rec.GeneratedIDs[:60])
	cfg := spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}}
	var stats []spec.Stats
	for _, reuse := range []bool{true, false} {
		slanes, closeSpec, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 2, Context: specContext,
			Draft: draft, Spec: cfg, NoPrefixReuse: !reuse})
		if err != nil {
			t.Fatal(err)
		}
		defer closeSpec()
		se := slanes[0].Engine.(*SpecEngine)
		if se.dcache.Config().Rows == nil || se.tcache.Config().Rows == nil {
			t.Fatal("the speculative GPU lane's caches hold their rows in host memory")
		}
		run := func(ctx []int32, n int) ([]int32, int, int) { return specTurn(t, se, ctx, n) }
		if got, _, _ := run(rec.PromptIDs, 60); !slices.Equal(got, rec.GeneratedIDs[:60]) {
			t.Fatalf("reuse %v: speculative first turn %v\nwant %v", reuse, got, rec.GeneratedIDs[:60])
		}
		before := se.Stats()
		got, prefilled, reused := run(sturn, 40)
		wantReused := 0
		if reuse {
			wantReused = len(sturn) - 1
		}
		if !slices.Equal(got, rec.GeneratedIDs[60:100]) || reused != wantReused || prefilled+reused != len(sturn) {
			t.Fatalf("reuse %v: speculative next turn %v with %d prefilled and %d reused\nwant %v with %d of %d reused",
				reuse, got, prefilled, reused, rec.GeneratedIDs[60:100], wantReused, len(sturn))
		}
		// The prompt again: new sequences with device copies of both
		// models' prompt rows.
		if got, _, reused := run(rec.PromptIDs, 30); !slices.Equal(got, rec.GeneratedIDs[:30]) || reuse && reused != len(rec.PromptIDs)-1 {
			t.Fatalf("reuse %v: speculative prompt again %v with %d reused\nwant %v with %d", reuse, got, reused, rec.GeneratedIDs[:30], len(rec.PromptIDs)-1)
		}
		st := se.Stats()
		st.TargetPasses -= before.TargetPasses
		st.DraftSteps -= before.DraftSteps
		st.Accepted -= before.Accepted
		stats = append(stats, st)
	}
	if a, b := stats[0], stats[1]; a.TargetPasses != b.TargetPasses || a.DraftSteps != b.DraftSteps || a.Accepted != b.Accepted {
		t.Errorf("speculative next turn with reuse: %d target passes, %d draft steps, %d accepted; prefilled whole: %d, %d, %d",
			a.TargetPasses, a.DraftSteps, a.Accepted, b.TargetPasses, b.DraftSteps, b.Accepted)
	}
}

// TestCUDABatchedLanes: on GPU lanes, requests that start together share
// their instructions and their passes. A plain lane copies the rows a
// live sequence has evaluated (device copies, kv.RowCopier) into those
// that waited for it; a speculative lane, resident and streamed with its
// IO pipeline, verifies all its members' trees in one target pass
// (spec.Group). Every sequence yields the reference tokens.
func TestCUDABatchedLanes(t *testing.T) {
	f, _ := realModel(t)
	r := greedyRecords(t, 120)[0]
	ctxs := [][]int32{ // each a prefix of the longest
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:40]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:60]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:50]),
	}
	const n = 30
	check := func(what string, l *lockstep) {
		t.Helper()
		for _, ctx := range ctxs {
			l.start(ctx)
		}
		l.until(n)
		for i, ctx := range ctxs {
			at := len(ctx) - len(r.PromptIDs)
			if want := r.GeneratedIDs[at : at+n]; !slices.Equal(l.got[i][:n], want) {
				t.Errorf("%s: sequence %d: %v\nwant %v", what, i, l.got[i][:n], want)
			}
		}
		l.free()
	}

	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 4, Context: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	plain := &lockstep{t: t, e: lanes[0].Engine.(*ModelEngine), limit: 1}
	check("plain GPU lane", plain)
	// As on the CPU (TestModelEngineSharesLivePrefix): the shortest
	// leads, then the longest leads the third.
	if want := len(ctxs[0]) + len(ctxs[2]) - 1; plain.prefilled != len(ctxs[1])+1 || plain.reused != want {
		t.Errorf("plain GPU lane: %d tokens prefilled and %d copied, want %d and %d", plain.prefilled, plain.reused, len(ctxs[1])+1, want)
	}

	draft, err := weights.Open(testutil.Model(t, "llama2xs_model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer draft.Close()
	plan, _, err := model.PlanStream(f, weights.StreamOptions{Mode: weights.StreamPipelined})
	if plan.Min == 0 {
		t.Fatalf("no minimum budget: %v", err)
	}
	for _, stream := range []*weights.StreamOptions{nil, {Mode: weights.StreamPipelined, Budget: plan.Min}} {
		slanes, closeSpec, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 4, Context: specContext, Stream: stream,
			Draft: draft, Spec: spec.Config{Method: spec.Tree, Pipeline: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer closeSpec()
		e := slanes[0].Engine.(*SpecEngine)
		check(fmt.Sprintf("speculative GPU lane, streamed %v", stream != nil), &lockstep{t: t, e: e, limit: n})
		if st := e.Stats(); e.Passes() >= int64(st.TargetPasses) {
			t.Errorf("streamed %v: %d target passes for %d trees; want the trees to share passes", stream != nil, e.Passes(), st.TargetPasses)
		}
	}
}

// BenchmarkCUDANextTurn is BenchmarkNextTurn on a GPU lane: a chat's next
// turn (about 390 tokens of conversation) to its first token, prefilled
// whole or from the rows the last turn left in device memory.
// TANDEM_BENCH_MODEL names another model with stories260K's vocabulary
// (one `tandem inflate` made, say); stories260K by default.
func BenchmarkCUDANextTurn(b *testing.B) {
	path := os.Getenv("TANDEM_BENCH_MODEL")
	if path == "" {
		path = testutil.Model(b, "stories260K.gguf")
	}
	f, err := weights.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	benchNextTurn(b, 512, func(b *testing.B, reuse bool) Engine {
		lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{gpuLane()}, MaxSeqs: 2, Context: 512, NoPrefixReuse: !reuse})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { closeLanes() })
		return lanes[0].Engine
	})
}
