package sched

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// specContext caps the pair's context (llama2xs's own is 256).
const specContext = 256

// greedyRecord is a line of the shared reference vectors.
type greedyRecord = testutil.Greedy

// greedyRecords reads stories260K's greedy references, each cut at n
// tokens and before a closing BOS (a stop token, which streams do not
// carry).
func greedyRecords(t *testing.T, n int) []greedyRecord {
	t.Helper()
	out := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")
	for i, r := range out {
		if j := slices.Index(r.GeneratedIDs, 1); j >= 0 {
			r.GeneratedIDs = r.GeneratedIDs[:j]
		}
		out[i].GeneratedIDs = r.GeneratedIDs[:min(n, len(r.GeneratedIDs))]
	}
	if len(out) < 4 {
		t.Fatalf("stories260K.greedy.jsonl holds %d records, want at least 4", len(out))
	}
	return out
}

// specTokens is how many tokens the parity tests generate per request:
// fewer under the race detector, which slows decoding about tenfold.
func specTokens() int {
	if raceEnabled || testing.Short() {
		return 24
	}
	return 120
}

// loadShared loads a model from the shared models with one thread.
func loadShared(t testing.TB, name string) *model.Model {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Threads: 1})
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return m
}

// newSpecEngine pairs llama2xs (draft) with stories260K (target).
func newSpecEngine(t *testing.T, cfg spec.Config, maxSeqs int) *SpecEngine {
	t.Helper()
	e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"), cfg,
		SpecEngineOptions{MaxSeqs: maxSeqs, Context: specContext, PrefillBudget: 16})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSpecEngineLimitOne: driven directly with Limit 1 (every extra token
// a round accepts is buffered) and with a large Limit, members joining at
// different steps and into freed slots, every sequence gets exactly the
// target's greedy tokens, and the draft saves target passes.
func TestSpecEngineLimitOne(t *testing.T) {
	n := specTokens()
	recs := greedyRecords(t, n)[:4]
	for _, tc := range []struct {
		name  string
		cfg   spec.Config
		limit int
	}{
		{"tree/limit1", spec.Config{Method: spec.Tree}, 1},
		{"tree/limit-n", spec.Config{Method: spec.Tree}, n},
		{"sd/limit1", spec.Config{Method: spec.SD, DraftLen: 4}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSpecEngine(t, tc.cfg, 3)
			got := make([][]int32, len(recs))
			seqs := make([]SeqID, len(recs))
			active := map[int]bool{}
			start := func(i int) {
				id, err := e.Start(recs[i].PromptIDs, nil, "")
				if err != nil {
					t.Fatal(err)
				}
				seqs[i], active[i] = id, true
			}
			start(0)
			start(1)
			for step := 0; len(active) > 0; step++ {
				if step == 2 {
					start(2)
				}
				var members []Member
				var which []int
				for i := range recs {
					if active[i] {
						members = append(members, Member{Seq: seqs[i], Limit: min(tc.limit, len(recs[i].GeneratedIDs)-len(got[i]))})
						which = append(which, i)
					}
				}
				out := make([]StepOut, len(members))
				if err := e.Step(context.Background(), members, out); err != nil {
					t.Fatal(err)
				}
				for j, i := range which {
					if out[j].Err != nil {
						t.Fatal(out[j].Err)
					}
					if len(out[j].Tokens) > members[j].Limit {
						t.Fatalf("step %d: %d tokens for a limit of %d", step, len(out[j].Tokens), members[j].Limit)
					}
					got[i] = append(got[i], out[j].Tokens...)
					if len(got[i]) == len(recs[i].GeneratedIDs) {
						delete(active, i)
						if err := e.Free(seqs[i]); err != nil {
							t.Fatal(err)
						}
						if i == 0 {
							start(3) // joins into the freed slot
						}
					}
				}
			}
			for i, r := range recs {
				if !slices.Equal(got[i], r.GeneratedIDs) {
					t.Errorf("record %d:\n got %v\nwant %v", i, got[i], r.GeneratedIDs)
				}
			}
			st := e.Stats()
			t.Logf("%d tokens in %d target passes (%.2f per pass), acceptance %.2f", st.Emitted, st.TargetPasses, st.TokensPerPass(), st.AcceptanceRate())
			if delivered := tokensIn(got); st.Emitted != delivered {
				t.Errorf("stats count %d tokens, the steps handed out %d", st.Emitted, delivered)
			}
			if st.TargetPasses >= st.Emitted {
				t.Errorf("%d target passes for %d tokens: the draft never helped", st.TargetPasses, st.Emitted)
			}
			if e.Live() != 0 || e.KVBytesInUse() != 0 {
				t.Errorf("%d sequences (%d bytes) still live", e.Live(), e.KVBytesInUse())
			}
			checkCachesFree(t, e)
		})
	}
}

// checkCachesFree frees the sequences kept for prefix reuse, then
// allocates every slot of both caches: it fails if a freed sequence
// holds one otherwise.
func checkCachesFree(t *testing.T, e *SpecEngine) {
	t.Helper()
	for _, h := range e.kept {
		if !e.dcache.Valid(h.Draft) || !e.tcache.Valid(h.Target) {
			t.Fatalf("kept sequences %d and %d are not allocated", h.Draft, h.Target)
		}
		e.dcache.Free(h.Draft)
		e.tcache.Free(h.Target)
	}
	e.kept = nil
	for _, c := range []*kv.Cache{e.dcache, e.tcache} {
		var ids []int
		for range e.opt.MaxSeqs {
			id, err := c.NewSeq()
			if err != nil {
				t.Fatalf("a freed sequence still holds a cache slot: %v", err)
			}
			ids = append(ids, id)
		}
		for _, id := range ids {
			c.Free(id)
		}
	}
}

// TestSpecEngineScheduler: concurrent requests through the live scheduler
// on a speculative lane get exactly the target's greedy tokens.
func TestSpecEngineScheduler(t *testing.T) {
	n := specTokens()
	recs := greedyRecords(t, n)
	if raceEnabled || testing.Short() {
		recs = recs[:4]
	}
	e := newSpecEngine(t, spec.Config{}, 4)
	s, err := New(Config{MaxBatch: 3}, nil, Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	var reqs []Request
	for _, r := range recs {
		reqs = append(reqs, Request{Prompt: r.PromptIDs, MaxTokens: len(r.GeneratedIDs), StopTokens: []int32{1}})
	}
	got, results := submitAll(t, s, reqs)
	for i, res := range results {
		if res != nil && res.Reason != ReasonLength {
			t.Errorf("request %d ended with %v (%v)", i, res.Reason, res.Err)
		}
	}
	for i, r := range recs {
		if !slices.Equal(got[i], r.GeneratedIDs) {
			t.Errorf("record %d: scheduled\n got %v\nwant %v", i, got[i], r.GeneratedIDs)
		}
	}
	waitFor(t, func() bool { return e.Live() == 0 })
	st := e.Stats()
	if st.TargetPasses >= st.Emitted {
		t.Errorf("%d target passes for %d tokens: the draft never helped", st.TargetPasses, st.Emitted)
	}
	if delivered := tokensIn(got); st.Emitted != delivered {
		t.Errorf("stats count %d tokens, the requests got %d", st.Emitted, delivered)
	}
}

// tokensIn counts the tokens of every sequence.
func tokensIn(seqs [][]int32) int {
	n := 0
	for _, s := range seqs {
		n += len(s)
	}
	return n
}

// TestSpecEngineSampledIsTheTargetsText: sampled requests with seeds get
// the same tokens from a speculative lane, whose timed trigger grows
// trees as the step costs fall, batched and joining at different steps,
// as from a lane running the target alone.
func TestSpecEngineSampledIsTheTargetsText(t *testing.T) {
	recs := greedyRecords(t, 60)[:6]
	if raceEnabled || testing.Short() {
		recs = recs[:3]
	}
	var reqs []Request
	for i, r := range recs {
		opt := sample.Options{Temperature: 0.9, TopP: 0.95, Seed: uint64(i) + 1}
		reqs = append(reqs, Request{Prompt: r.PromptIDs, MaxTokens: 60, StopTokens: []int32{1}, Sampling: opt})
	}
	run := func(e Engine) [][]int32 {
		s, err := New(Config{MaxBatch: 3}, nil, Lane{Engine: e})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown(context.Background())
		got, _ := submitAll(t, s, reqs)
		return got
	}
	alone, err := NewModelEngine(loadShared(t, "stories260K.bin"), ModelEngineOptions{MaxSeqs: 3, Context: specContext})
	if err != nil {
		t.Fatal(err)
	}
	want := run(alone)
	e := newSpecEngine(t, spec.Config{}, 3)
	got := run(e)
	for i := range recs {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: speculative lane\n got %v\nwant %v (the target alone)", i, got[i], want[i])
		}
	}
	if st := e.Stats(); st.Accepted == 0 {
		t.Errorf("no drafted token was accepted in %d passes: the test did not exercise speculation", st.TargetPasses)
	}
}

// submitAll submits reqs together and reads every stream to its end, each
// on its own goroutine; a stream's error fails the test, and leaves its
// result nil.
func submitAll(t *testing.T, s *Scheduler, reqs []Request) ([][]int32, []*Result) {
	t.Helper()
	got, results := make([][]int32, len(reqs)), make([]*Result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		st, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[i], results[i], err = recvAll(st); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	return got, results
}

// recvAll reads a stream to its end; unlike collect it may run outside
// the test's goroutine.
func recvAll(st *Stream) ([]int32, *Result, error) {
	var toks []int32
	for {
		ev, err := st.Recv(context.Background())
		if err != nil {
			return toks, nil, err
		}
		toks = append(toks, ev.Tokens...)
		if ev.Done {
			return toks, ev.Result, nil
		}
	}
}

// TestSpecEngineCancelFrees: cancelling a request mid-generation frees
// its sequences in both the draft's and the target's cache.
func TestSpecEngineCancelFrees(t *testing.T) {
	recs := greedyRecords(t, 200)
	e := newSpecEngine(t, spec.Config{}, 2)
	s, err := New(Config{}, nil, Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	for _, r := range recs[:2] {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := s.Submit(ctx, Request{Prompt: r.PromptIDs, MaxTokens: specContext})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(context.Background()); err != nil {
			t.Fatal(err)
		}
		if e.Live() != 1 {
			t.Fatalf("%d sequences live while decoding, want 1", e.Live())
		}
		cancel()
		waitFor(t, func() bool { return e.Live() == 0 })
	}
	checkCachesFree(t, e)
}

func TestSpecEngineErrors(t *testing.T) {
	draft, target := loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin")
	// The pipeline needs the lane a streamed target was loaded with; a
	// resident target never waits on IO, and the pipeline is off.
	f, _ := realModel(t)
	plan, _, err := model.PlanStream(f, weights.StreamOptions{})
	if plan.Min == 0 {
		t.Fatalf("no minimum budget: %v", err)
	}
	streamed, err := model.Load(f, model.Options{Threads: 1, Stream: &weights.StreamOptions{Budget: plan.Min}})
	if err != nil {
		t.Fatal(err)
	}
	defer streamed.Close()
	if _, err := NewSpecEngine(draft, streamed, spec.Config{Pipeline: true}, SpecEngineOptions{}); err == nil || !strings.Contains(err.Error(), "Lane") {
		t.Errorf("pipeline on a streamed target without its lane: %v; want an error asking for Config.Lane", err)
	}
	if e, err := NewSpecEngine(draft, target, spec.Config{Pipeline: true}, SpecEngineOptions{}); err != nil || e.cfg.Pipeline {
		t.Errorf("pipeline on a resident target: %v, pipeline left %v; want it accepted and off", err, e != nil && e.cfg.Pipeline)
	}
	if _, err := NewSpecEngine(draft, target, spec.Config{MaxTree: -1}, SpecEngineOptions{}); err == nil {
		t.Error("negative tree size accepted")
	}
	// The lane serves the target's context (512), past the draft's 256;
	// a longer one asked for is an error, not quietly capped.
	if e, err := NewSpecEngine(draft, target, spec.Config{}, SpecEngineOptions{}); err != nil || e.Info().Context != 512 {
		t.Errorf("a 256-token draft with a 512-token target: %v; want a lane of the target's 512", err)
	}
	if _, err := NewSpecEngine(draft, target, spec.Config{}, SpecEngineOptions{Context: 513}); err == nil || !strings.Contains(err.Error(), "(512)") {
		t.Errorf("context 513 with a 512-token target: %v; want an error naming 512", err)
	}
	for _, dc := range []int{-1, 1} {
		if _, err := NewSpecEngine(draft, target, spec.Config{}, SpecEngineOptions{DraftContext: dc}); err == nil {
			t.Errorf("draft context %d accepted", dc)
		}
	}
	e, err := NewSpecEngine(draft, target, spec.Config{Trigger: &spec.CostAware{}}, SpecEngineOptions{MaxSeqs: 1, Context: 16})
	if err != nil {
		t.Fatal(err)
	}
	if info := e.Info(); info.Context != 16 || info.MaxSeqs != 1 || info.SeqBytes <= 0 {
		t.Errorf("info %+v, want context 16, one sequence, its bytes", info)
	}
	if a, b := e.seqConfig().Trigger, e.seqConfig().Trigger; a == b || a == e.cfg.Trigger {
		t.Error("sequences share one stateful trigger")
	}
	for _, tc := range []struct {
		name   string
		tokens []int32
		want   error
	}{
		{"empty", nil, nil},
		{"outside the vocabulary", []int32{1, 9999}, ErrInvalid},
		{"negative token", []int32{1, -3}, ErrInvalid},
		{"over the context", make([]int32, 17), ErrContextFull},
	} {
		_, err := e.Start(tc.tokens, nil, "")
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	id, err := e.Start([]int32{1, 403}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start([]int32{1}, nil, ""); err == nil {
		t.Error("start past MaxSeqs accepted")
	}
	out := make([]StepOut, 2)
	if err := e.Step(context.Background(), []Member{{Seq: id, Limit: 1}, {Seq: 77, Limit: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(out[1].Err, kv.ErrUnknownSeq) || out[0].Prefilled != 2 || out[0].Err != nil {
		t.Errorf("unknown member: %v; known member prefilled %d (%v)", out[1].Err, out[0].Prefilled, out[0].Err)
	}
	// Decode to the context's end: the last step reports it full.
	var toks []int32
	for range 20 {
		if err := e.Step(context.Background(), []Member{{Seq: id, Limit: 1}}, out[:1]); err != nil {
			t.Fatal(err)
		}
		if out[0].Err != nil {
			if !errors.Is(out[0].Err, kv.ErrContextFull) {
				t.Errorf("at the context's end: %v, want kv.ErrContextFull", out[0].Err)
			}
			break
		}
		toks = append(toks, out[0].Tokens...)
	}
	if len(toks) < 16-2 {
		t.Errorf("%d tokens before the context of 16 filled after a prompt of 2", len(toks))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Step(ctx, []Member{{Seq: id, Limit: 1}}, out[:1]); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled step: %v", err)
	}
	if err := e.Free(id); err != nil {
		t.Fatal(err)
	}
	if err := e.Free(id); !errors.Is(err, kv.ErrUnknownSeq) {
		t.Errorf("second free: %v, want kv.ErrUnknownSeq", err)
	}
	checkCachesFree(t, e)
}

// specTurn starts ctx on e, steps it alone until it yields n tokens,
// frees it, and says how many context tokens it prefilled and reused.
func specTurn(t *testing.T, e *SpecEngine, ctx []int32, n int) (got []int32, prefilled, reused int) {
	t.Helper()
	before := e.ReusedTokens()
	id, err := e.Start(ctx, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]StepOut, 1)
	for len(got) < n {
		if err := e.Step(context.Background(), []Member{{Seq: id, Limit: n}}, out); err != nil || out[0].Err != nil {
			t.Fatal(err, out[0].Err)
		}
		prefilled += out[0].Prefilled
		got = append(got, out[0].Tokens...)
	}
	if err := e.Free(id); err != nil {
		t.Fatal(err)
	}
	return got[:n], prefilled, int(e.ReusedTokens() - before)
}

// TestSpecEnginePrefixReuse: on a speculative lane a chat's next turn
// adopts the sequences the first turn left in both caches and prefills
// only its last token; the tokens are the target's greedy ones, and the
// rounds (draft steps, target passes) are those of a lane that prefilled
// the whole context, so both caches held the same rows.
func TestSpecEnginePrefixReuse(t *testing.T) {
	r := greedyRecords(t, 120)[0]
	cfg := spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}}
	turn := slices.Concat(r.PromptIDs, r.GeneratedIDs[:60])
	var stats []spec.Stats
	for _, reuse := range []bool{true, false} {
		e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"), cfg,
			SpecEngineOptions{MaxSeqs: 2, Context: specContext, NoPrefixReuse: !reuse})
		if err != nil {
			t.Fatal(err)
		}
		run := func(ctx []int32, n int) ([]int32, int, int) { return specTurn(t, e, ctx, n) }
		if got, _, _ := run(r.PromptIDs, 60); !slices.Equal(got, r.GeneratedIDs[:60]) {
			t.Fatalf("reuse %v: first turn %v, want %v", reuse, got, r.GeneratedIDs[:60])
		}
		before := e.Stats()
		predicted := e.Reusable(turn, nil)
		got, prefilled, reused := run(turn, 40)
		if !slices.Equal(got, r.GeneratedIDs[60:100]) {
			t.Errorf("reuse %v: next turn %v, want %v", reuse, got, r.GeneratedIDs[60:100])
		}
		wantReused := 0
		if reuse {
			wantReused = len(turn) - 1
		}
		if reused != wantReused || predicted != wantReused || prefilled+reused != len(turn) {
			t.Errorf("reuse %v: %d reused (%d predicted) and %d prefilled of %d, want %d reused", reuse, reused, predicted, prefilled, len(turn), wantReused)
		}
		// One sequence was live at a time: the caches hold one each.
		if want := e.dcache.Config().SeqBytes() + e.tcache.Config().SeqBytes(); e.KVBytesHeld() != want {
			t.Errorf("reuse %v: %d KV bytes held, want %d", reuse, e.KVBytesHeld(), want)
		}
		st := e.Stats()
		st.TargetPasses -= before.TargetPasses
		st.DraftSteps -= before.DraftSteps
		st.Accepted -= before.Accepted
		stats = append(stats, st)
		checkCachesFree(t, e)
	}
	if a, b := stats[0], stats[1]; a.TargetPasses != b.TargetPasses || a.DraftSteps != b.DraftSteps || a.Accepted != b.Accepted {
		t.Errorf("next turn with reuse: %d target passes, %d draft steps, %d accepted; prefilled whole: %d, %d, %d",
			a.TargetPasses, a.DraftSteps, a.Accepted, b.TargetPasses, b.DraftSteps, b.Accepted)
	}
}

// TestSpecEngineKeepsConversations is TestModelEngineKeepsConversations on
// a speculative lane: two clients taking turns each keep their
// conversation in both caches, a first turn and the same prompt again
// starting from copied rows; the rounds match a lane that prefills every
// context whole, so the copied draft rows are right too. TrimKV then
// gives back all the memory, and the lane goes on.
func TestSpecEngineKeepsConversations(t *testing.T) {
	recs := greedyRecords(t, 120)
	a, b := recs[0], recs[1]
	cfg := spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}}
	type step struct {
		ctx  []int32
		want []int32
		// reused: the tokens reuse must take (-1: the prefix shared with
		// the first turn of a)
		reused int
	}
	nextA := slices.Concat(a.PromptIDs, a.GeneratedIDs[:60])
	nextB := slices.Concat(b.PromptIDs, b.GeneratedIDs[:60])
	steps := []step{
		{a.PromptIDs, a.GeneratedIDs[:60], 0},
		{b.PromptIDs, b.GeneratedIDs[:60], commonPrefix(a.PromptIDs, b.PromptIDs)},
		{nextA, a.GeneratedIDs[60:100], len(nextA) - 1},
		{nextB, b.GeneratedIDs[60:100], len(nextB) - 1},
		{a.PromptIDs, a.GeneratedIDs[:30], len(a.PromptIDs) - 1},
		{slices.Concat(nextA, a.GeneratedIDs[60:100]), a.GeneratedIDs[100:120], len(nextA) + 39},
	}
	var stats []spec.Stats
	for _, reuse := range []bool{true, false} {
		e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"), cfg,
			SpecEngineOptions{MaxSeqs: 4, Context: specContext, NoPrefixReuse: !reuse})
		if err != nil {
			t.Fatal(err)
		}
		for i, st := range steps {
			got, prefilled, reused := specTurn(t, e, st.ctx, len(st.want))
			want := 0
			if reuse {
				want = st.reused
			}
			if !slices.Equal(got, st.want) || reused != want || prefilled+reused != len(st.ctx) {
				t.Fatalf("reuse %v, turn %d: %v with %d reused and %d prefilled\nwant %v with %d reused of %d", reuse, i, got, reused, prefilled, st.want, want, len(st.ctx))
			}
		}
		stats = append(stats, e.Stats())
		// TrimKV gives back both caches' kept sequences and spares.
		held := e.KVBytesHeld()
		if n, err := e.TrimKV(); err != nil || n != held || held == 0 || e.KVBytesHeld() != 0 {
			t.Errorf("reuse %v: TrimKV released %d of %d bytes (%v), %d left", reuse, n, held, err, e.KVBytesHeld())
		}
		checkCachesFree(t, e)
		if got, _, _ := specTurn(t, e, nextA, 10); !slices.Equal(got, a.GeneratedIDs[60:70]) {
			t.Errorf("reuse %v: after TrimKV %v, want %v", reuse, got, a.GeneratedIDs[60:70])
		}
	}
	if a, b := stats[0], stats[1]; a.TargetPasses != b.TargetPasses || a.DraftSteps != b.DraftSteps || a.Accepted != b.Accepted {
		t.Errorf("with reuse: %d target passes, %d draft steps, %d accepted; prefilled whole: %d, %d, %d",
			a.TargetPasses, a.DraftSteps, a.Accepted, b.TargetPasses, b.DraftSteps, b.Accepted)
	}
}

// TestSpecEngineSharesLivePrefix is TestModelEngineSharesLivePrefix on a
// speculative lane: a sequence starting while another is live copies the
// context rows that one's decoder has committed in both caches, at its
// start (all but the prompt's last chunk) and after its first round (the
// rest). The tokens are the target's, and each sequence runs the same
// rounds as on a lane that prefills every context whole, so the copied
// draft rows are right too.
func TestSpecEngineSharesLivePrefix(t *testing.T) {
	r := greedyRecords(t, 120)[0]
	p := len(r.PromptIDs)
	ctxs := [][]int32{
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:60]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:50]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:55]),
	}
	const chunk, n = 16, 20
	// The first sequence's target commits all but its last chunk at its
	// start: the second copies those; after its first round, all of it.
	wantReused := []int{0, p + 60 - 1 - chunk, len(ctxs[2]) - 1}
	var stats [2][]spec.Stats
	for k, reuse := range []bool{true, false} {
		e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"),
			spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}},
			SpecEngineOptions{MaxSeqs: 4, Context: specContext, PrefillChunk: chunk, NoPrefixReuse: !reuse})
		if err != nil {
			t.Fatal(err)
		}
		l := &lockstep{t: t, e: e, limit: n}
		start := func() {
			t.Helper()
			i := len(l.ids)
			if reused, want := l.start(ctxs[i]), wantReused[i]; reuse && reused != want || !reuse && reused != 0 {
				t.Errorf("reuse %v: sequence %d reused %d tokens, want %d", reuse, i, reused, want)
			}
		}
		start()
		l.step() // the first sequence's prefill
		start()
		for len(l.got[0]) == 0 {
			l.step()
		}
		start()
		l.until(n)
		for i, ctx := range ctxs {
			at := len(ctx) - p
			if want := r.GeneratedIDs[at : at+n]; !slices.Equal(l.got[i][:n], want) {
				t.Errorf("reuse %v: sequence %d: %v\nwant %v", reuse, i, l.got[i][:n], want)
			}
			stats[k] = append(stats[k], e.seqs[l.ids[i]].dec.Stats())
		}
		l.free()
		if len(e.open) != 0 {
			t.Errorf("reuse %v: %d live sequences still offered for copying after all were freed", reuse, len(e.open))
		}
	}
	for i := range ctxs {
		if a, b := stats[0][i], stats[1][i]; a.TargetPasses != b.TargetPasses || a.DraftSteps != b.DraftSteps || a.Accepted != b.Accepted {
			t.Errorf("sequence %d with copied rows: %d target passes, %d draft steps, %d accepted; prefilled whole: %d, %d, %d",
				i, a.TargetPasses, a.DraftSteps, a.Accepted, b.TargetPasses, b.DraftSteps, b.Accepted)
		}
	}

	// All three start together, the shortest first: the others copy what
	// its decoder has committed, wait for its first round to commit the
	// rest, and copy that; the longest then leads the third the same
	// way, which prefills only its last token.
	e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"),
		spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}},
		SpecEngineOptions{MaxSeqs: 4, Context: specContext, PrefillChunk: chunk})
	if err != nil {
		t.Fatal(err)
	}
	together := [][]int32{ctxs[1], ctxs[0], ctxs[2]}
	l := &lockstep{t: t, e: e, limit: n}
	for _, ctx := range together {
		l.start(ctx)
	}
	l.until(n)
	for i, ctx := range together {
		at := len(ctx) - p
		if want := r.GeneratedIDs[at : at+n]; !slices.Equal(l.got[i][:n], want) {
			t.Errorf("started together, sequence %d: %v\nwant %v", i, l.got[i][:n], want)
		}
	}
	if want := len(together[0]) + len(together[2]) - 1; l.prefilled != len(together[1])+1 || l.reused != want {
		t.Errorf("started together: %d tokens prefilled and %d copied, want %d and %d", l.prefilled, l.reused, len(together[1])+1, want)
	}
	// Their trees shared target passes (spec.Group).
	if passes, trees := e.Passes(), e.Stats().TargetPasses; passes >= int64(trees) {
		t.Errorf("started together: %d target passes for %d trees; want the trees to share passes", passes, trees)
	}
	l.free()
}

// BenchmarkSpecNextTurn is BenchmarkNextTurn on a speculative lane
// (llama2xs drafting for stories260K): the conversation so far started
// again up to the first emitted tokens, prefilled whole into both models
// or adopted from the last turn's rows.
func BenchmarkSpecNextTurn(b *testing.B) {
	benchNextTurn(b, specContext-16, func(b *testing.B, reuse bool) Engine {
		e, err := NewSpecEngine(loadShared(b, "llama2xs_model.bin"), loadShared(b, "stories260K.bin"), spec.Config{Method: spec.Tree},
			SpecEngineOptions{MaxSeqs: 2, Context: specContext, NoPrefixReuse: !reuse})
		if err != nil {
			b.Fatal(err)
		}
		return e
	})
}

// TestSpecStartCopyFailure is TestStartCopyFailure on a speculative lane:
// a pair whose copy failed is freed in both caches, kept or new.
func TestSpecStartCopyFailure(t *testing.T) {
	for _, keep := range []int64{0, -1} {
		e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"), spec.Config{Method: spec.Tree},
			SpecEngineOptions{MaxSeqs: 4, Context: specContext, PrefixCache: keep})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []**kv.Cache{&e.dcache, &e.tcache} {
			cfg := (*c).Config()
			cfg.Rows = failingCopyRows{}
			if *c, err = kv.New(cfg); err != nil {
				t.Fatal(err)
			}
		}
		long := prompt(30)
		for _, toks := range [][]int32{{1, 99, 98, 97, 96}, long} {
			var h spec.Held
			h.Draft, _ = e.dcache.NewSeq()
			h.Target, _ = e.tcache.NewSeq()
			for _, cs := range []struct {
				c  *kv.Cache
				id int
			}{{e.dcache, h.Draft}, {e.tcache, h.Target}} {
				cs.c.Reserve(cs.id, len(toks))
				cs.c.CommitAll(cs.id)
			}
			h.DraftLen, h.TargetLen, h.Tokens = len(toks), len(toks), toks
			e.kept = append(e.kept, h)
		}
		if _, err := e.Start(append(slices.Clone(long[:10]), 7, 8, 9), nil, ""); err == nil {
			t.Fatalf("PrefixCache %d: Start succeeded with a failing copy", keep)
		}
		wantKept := 2
		if keep < 0 {
			wantKept = 1
		}
		allocated := 0
		for id := range 4 {
			if e.dcache.Valid(id) != e.tcache.Valid(id) {
				t.Fatalf("PrefixCache %d: sequence %d allocated in one cache only", keep, id)
			}
			if e.dcache.Valid(id) {
				allocated++
			}
		}
		if len(e.kept) != wantKept || allocated != wantKept || !slices.Equal(e.kept[len(e.kept)-1].Tokens, long) {
			t.Errorf("PrefixCache %d: after the failed copy %d kept, %d pairs allocated; want %d, the source last", keep, len(e.kept), allocated, wantKept)
		}
	}
}

// TestSpecEngineFreedBeforeItsFirstStep: a sequence that started with a
// copy of another's rows and was freed before its first step (a client
// that went away at once) is kept with the tokens those rows hold, and a
// later start plans over it (it panicked on a kept pair without tokens;
// FuzzSpecEngine found it).
func TestSpecEngineFreedBeforeItsFirstStep(t *testing.T) {
	r := greedyRecords(t, 60)[0]
	e, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"), spec.Config{Method: spec.Tree},
		SpecEngineOptions{MaxSeqs: 4, Context: specContext})
	if err != nil {
		t.Fatal(err)
	}
	long := slices.Concat(r.PromptIDs, r.GeneratedIDs[:50])
	specTurn(t, e, long, 5) // kept: the conversation
	// The prompt alone shares less than the kept pair would lose: new
	// sequences with a copy of its rows.
	id, err := e.Start(r.PromptIDs, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Free(id); err != nil {
		t.Fatal(err)
	}
	if got, _, reused := specTurn(t, e, r.PromptIDs, 20); !slices.Equal(got, r.GeneratedIDs[:20]) || reused != len(r.PromptIDs)-1 {
		t.Errorf("the prompt again: %v with %d reused\nwant %v with %d", got, reused, r.GeneratedIDs[:20], len(r.PromptIDs)-1)
	}
}

// FuzzSpecEngine drives three engines through the same starts, steps
// and frees: a speculative lane with prefix reuse, one without, and a
// plain lane on the target alone, with contexts cut from earlier ones
// and their answers (so they share prefixes of every length, with live
// sequences and kept ones). Every sequence must yield the target's own
// greedy tokens on all three: the speculative lanes verify their
// members' trees in one pass (spec.Group) and copy or adopt rows, and
// neither may change a token.
func FuzzSpecEngine(f *testing.F) {
	f.Add([]byte{0, 0, 4, 1, 3, 0, 0, 9, 1, 1, 1, 2, 0, 0, 1, 9, 3, 1, 2, 2, 0})
	f.Add([]byte{0, 0, 5, 0, 0, 3, 0, 1, 40, 1, 1, 1, 2, 1, 0, 2, 40, 1, 3, 2, 0, 0, 1, 30, 1, 1})
	file, _ := realModel(f)
	target := loadModel(f, file)
	drafts := []*model.Model{loadShared(f, "llama2xs_model.bin"), loadShared(f, "llama2xs_model.bin")}
	targets := []*model.Model{loadModel(f, file), loadModel(f, file)}
	base := testutil.GreedyRecords(f, "stories260K.greedy.jsonl")[0].PromptIDs
	cfg := spec.Config{Method: spec.Tree, MaxTree: 8, Trigger: spec.FixedSize{N: 8}}
	f.Fuzz(func(t *testing.T, ops []byte) {
		const ctxLen, maxSeqs = 96, 3
		var engines [3]Engine
		for k := range 2 {
			// The engine with prefix reuse gives its draft a window of
			// 32 positions, which slides (spec.Decoder) past them.
			e, err := NewSpecEngine(drafts[k], targets[k], cfg, SpecEngineOptions{MaxSeqs: maxSeqs, Context: ctxLen, DraftContext: 32 * (1 - k),
				PrefillChunk: 5, NoPrefixReuse: k == 1})
			if err != nil {
				t.Fatal(err)
			}
			engines[k] = e
		}
		plain, err := NewModelEngine(target, ModelEngineOptions{MaxSeqs: maxSeqs, Context: ctxLen, NoPrefixReuse: true})
		if err != nil {
			t.Fatal(err)
		}
		engines[2] = plain
		type live struct {
			ids [3]SeqID
			ctx []int32
			out [3][]int32
		}
		var seqs []*live
		script := &fuzzScript{ops: ops, pool: [][]int32{base}}
		free := func(i int) {
			s := seqs[i]
			for k, e := range engines {
				if err := e.Free(s.ids[k]); err != nil {
					t.Fatal(err)
				}
			}
			script.finished(s.ctx, s.out[2][:min(len(s.out[0]), len(s.out[1]), len(s.out[2]))])
			seqs = slices.Delete(seqs, i, i+1)
		}
		for script.more() {
			switch script.next() % 3 {
			case 0: // start a context cut from the pool, maybe with a token of its own
				if len(seqs) == maxSeqs {
					continue
				}
				s := &live{ctx: script.context(ctxLen / 2)}
				for k, e := range engines {
					id, err := e.Start(s.ctx, nil, "")
					if err != nil {
						t.Fatal(err)
					}
					s.ids[k] = id
				}
				seqs = append(seqs, s)
			case 1: // step every live sequence together, a few times
				for range 1 + int(script.next())%4 {
					if len(seqs) == 0 {
						break
					}
					for k, e := range engines {
						members := make([]Member, len(seqs))
						for i, s := range seqs {
							members[i] = Member{Seq: s.ids[k], Limit: 1}
						}
						out := make([]StepOut, len(seqs))
						if err := e.Step(context.Background(), members, out); err != nil {
							t.Fatal(err)
						}
						for i, s := range seqs {
							if out[i].Err != nil {
								t.Fatal(out[i].Err)
							}
							s.out[k] = append(s.out[k], out[i].Tokens...)
						}
					}
					for i, s := range seqs {
						n := min(len(s.out[0]), len(s.out[1]), len(s.out[2]))
						if !slices.Equal(s.out[0][:n], s.out[2][:n]) || !slices.Equal(s.out[1][:n], s.out[2][:n]) {
							t.Fatalf("sequence %d from %v: speculative with reuse %v, without %v; the target alone %v", i, s.ctx, s.out[0], s.out[1], s.out[2])
						}
					}
					for i := len(seqs) - 1; i >= 0; i-- {
						if s := seqs[i]; len(s.ctx)+max(len(s.out[0]), len(s.out[1]), len(s.out[2])) >= ctxLen-10 {
							free(i)
						}
					}
				}
			case 2: // free one
				if len(seqs) > 0 {
					free(int(script.next()) % len(seqs))
				}
			}
		}
		for len(seqs) > 0 {
			free(0)
		}
		for k, e := range engines {
			if n := e.(interface{ Live() int }).Live(); n != 0 {
				t.Fatalf("engine %d: %d sequences live after freeing all", k, n)
			}
		}
	})
}

// TestSpecEngineServesTheTargetsContext: a speculative lane serves the
// target's whole context (stories260K's 512), past the draft's 256: a
// prompt the draft cannot hold, and an answer that outgrows it, come out
// as the target alone writes them.
func TestSpecEngineServesTheTargetsContext(t *testing.T) {
	draft, target := loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin")
	e, err := NewSpecEngine(draft, target, spec.Config{}, SpecEngineOptions{MaxSeqs: 2, PrefillBudget: 64})
	if err != nil {
		t.Fatal(err)
	}
	if e.Info().Context != 512 {
		t.Fatalf("lane context %d, want the target's 512", e.Info().Context)
	}
	cache, err := target.NewCache(512, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	short := greedyRecords(t, 1)[0].PromptIDs
	whole, err := spec.Generate(context.Background(), target, cache, short, spec.GenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	history := slices.Concat(short, whole.Ids)
	n := 100
	if raceEnabled || testing.Short() {
		n = 24
	}
	reqs := []struct{ prompt, want []int32 }{
		{history[:300], history[300 : 300+n]},
		{short, whole.Ids[:250+n]},
	}
	s, err := New(Config{MaxBatch: 2}, nil, Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		if streams[i], err = s.Submit(context.Background(), Request{Prompt: r.prompt, MaxTokens: len(r.want)}); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range reqs {
		got, res, err := recvAll(streams[i])
		if err != nil || res.Reason != ReasonLength || !slices.Equal(got, r.want) {
			t.Errorf("request %d (%d-token prompt): %v, %v\n got %v\nwant %v", i, len(r.prompt), err, res, got, r.want)
		}
	}
	waitFor(t, func() bool { return e.Live() == 0 })
	if st := e.Stats(); st.Slides == 0 || st.Accepted == 0 {
		t.Errorf("%d slides, %d accepted: want the draft's window to slide and the draft to help", st.Slides, st.Accepted)
	}
}

// TestAddSpecStatsSumsEveryCounter: the lane's counters are the sum of
// its decoders' (the largest tree the largest), every field of
// spec.Stats, so a counter added there cannot read zero here.
func TestAddSpecStatsSumsEveryCounter(t *testing.T) {
	var a, b spec.Stats
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := range va.NumField() {
		switch f := va.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(i + 1))
			vb.Field(i).SetInt(int64(10 * (i + 1)))
		case reflect.Slice:
			a.AcceptLen, b.AcceptLen = []int{1}, []int{2, 3}
		}
	}
	sum := reflect.ValueOf(addSpecStats(a, b))
	for i := range va.NumField() {
		name, f := va.Type().Field(i).Name, sum.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			want := int64(11 * (i + 1))
			if name == "MaxTree" {
				want = int64(10 * (i + 1))
			}
			if f.Int() != want {
				t.Errorf("%s: %d, want %d", name, f.Int(), want)
			}
		}
	}
	if got := addSpecStats(a, b).AcceptLen; !slices.Equal(got, []int{3, 3}) {
		t.Errorf("AcceptLen %v, want [3 3]", got)
	}
}
