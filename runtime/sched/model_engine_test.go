package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

// realModel opens stories260K.gguf with its tokenizer.
func realModel(t testing.TB) (*weights.File, *tokenizer.Tokenizer) {
	t.Helper()
	f := openShared(t, "stories260K.gguf")
	tok, err := tokenizer.FromMetadata(&f.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	return f, tok
}

func loadModel(t testing.TB, f *weights.File) *model.Model {
	t.Helper()
	return loadModelThreads(t, f, 1)
}

// loadModelThreads loads f on a pool of threads, closed with the test.
func loadModelThreads(t testing.TB, f *weights.File, threads int) *model.Model {
	t.Helper()
	m, err := model.Load(f, model.Options{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// openShared opens a model of ../shared, closed with the test.
func openShared(t testing.TB, name string) *weights.File {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

var testPrompts = []string{
	"Once upon a time",
	"Tom had a red ball. He",
	"The sun was hot and the cat",
	"Lily wanted to play in the park with her friends, but",
	"One day",
}

// reference generates greedily with the plain single-sequence loop.
func reference(t *testing.T, m *model.Model, ids []int32, n int) []int32 {
	t.Helper()
	cache, err := m.NewCache(512, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	res, err := spec.Generate(context.Background(), m, cache, ids, spec.GenOptions{MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	return res.Ids
}

func encode(t *testing.T, tok *tokenizer.Tokenizer, s string) []int32 {
	t.Helper()
	ids, err := tok.Encode(s, tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestModelEngineBatchedMatchesSingle: sequences decoded together in one
// Forward per step, joining at different steps and prefilling in small
// chunks beside decoding members, give exactly the tokens each gets alone.
func TestModelEngineBatchedMatchesSingle(t *testing.T) {
	f, tok := realModel(t)
	m := loadModel(t, f)
	const n = 40
	var want [][]int32
	var prompts [][]int32
	for _, p := range testPrompts {
		ids := encode(t, tok, p)
		prompts = append(prompts, ids)
		want = append(want, reference(t, loadModel(t, f), ids, n))
	}
	e, err := NewModelEngine(m, ModelEngineOptions{MaxSeqs: 4, Context: 512, PrefillChunk: 5})
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]int32, len(prompts))
	prefilled := make([]int, len(prompts)) // the scheduler's cost model counts these as prefill
	reused := make([]int, len(prompts))    // taken from a freed or a live sequence's rows (prefix reuse)
	seqs := make([]SeqID, len(prompts))
	active := map[int]bool{}
	start := func(i int) {
		before := e.ReusedTokens()
		id, err := e.Start(prompts[i], nil, "")
		if err != nil {
			t.Fatal(err)
		}
		seqs[i] = id
		active[i] = true
		reused[i] = int(e.ReusedTokens() - before)
	}
	start(0)
	start(1)
	for step := 0; len(active) > 0 || step < 8; step++ {
		if step == 3 {
			start(2)
			start(3)
		}
		if len(active) == 0 {
			continue
		}
		var members []Member
		var which []int
		for i := range prompts {
			if active[i] {
				members = append(members, Member{Seq: seqs[i], Limit: 1})
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
			if len(got[i]) > 0 && out[j].Prefilled != 0 {
				t.Errorf("prompt %q: decode step %d reports %d prefilled tokens", testPrompts[i], len(got[i]), out[j].Prefilled)
			}
			prefilled[i] += out[j].Prefilled
			reused[i] += out[j].Reused
			got[i] = append(got[i], out[j].Tokens...)
			if len(got[i]) == n {
				delete(active, i)
				if err := e.Free(seqs[i]); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					start(4) // joins into the freed slot
				}
			}
		}
	}
	for i := range prompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("prompt %q: batched %v\nalone %v", testPrompts[i], got[i], want[i])
		}
		if prefilled[i]+reused[i] != len(prompts[i]) {
			t.Errorf("prompt %q: %d tokens reported prefilled and %d reused, the prompt has %d", testPrompts[i], prefilled[i], reused[i], len(prompts[i]))
		}
	}
	if e.Live() != 0 {
		t.Errorf("%d sequences still live", e.Live())
	}
}

// TestModelEngineSamplesInParallel: with a 32000-token vocabulary and a
// two-thread pool, a step's members sample on the pool's threads, and
// each still draws exactly the tokens its own sampler draws for it alone
// on one thread (run with -race, this also checks the draws share
// nothing).
func TestModelEngineSamplesInParallel(t *testing.T) {
	f := openShared(t, "llama-2-tiny-random.gguf")
	load := func(threads int) *model.Model { return loadModelThreads(t, f, threads) }
	if v := load(1).Config().Vocab; v < parallelSampleVocab {
		t.Fatalf("vocabulary %d: the test needs one of at least %d", v, parallelSampleVocab)
	}
	opts := []sample.Options{
		{Temperature: 1, Seed: 1},
		{Temperature: 0.8, TopP: 0.9, Seed: 2},
		{}, // greedy
		{Temperature: 1.2, TopK: 40, RepeatPenalty: 1.1, Seed: 4},
		{Temperature: 1, MinP: 0.05, Seed: 5},
	}
	prompts := [][]int32{{1, 450, 4996}, {1, 9038, 2501, 263, 931}, {1, 306}, {1, 1724, 338, 278}, {1, 319, 2217}}
	const n = 24
	decode := func(e *ModelEngine, which []int) [][]int32 {
		t.Helper()
		seqs := make([]Member, len(which))
		for j, i := range which {
			id, err := e.Start(prompts[i], sample.New(opts[i]), "")
			if err != nil {
				t.Fatal(err)
			}
			seqs[j] = Member{Seq: id, Limit: 1}
		}
		got := make([][]int32, len(which))
		out := make([]StepOut, len(seqs))
		for len(got[0]) < n {
			if err := e.Step(context.Background(), seqs, out); err != nil {
				t.Fatal(err)
			}
			for j := range seqs {
				if out[j].Err != nil {
					t.Fatal(out[j].Err)
				}
				got[j] = append(got[j], out[j].Tokens...)
			}
		}
		for _, m := range seqs {
			e.Free(m.Seq)
		}
		return got
	}
	newEngine := func(threads int) *ModelEngine {
		e, err := NewModelEngine(load(threads), ModelEngineOptions{MaxSeqs: len(prompts), Context: 64, NoPrefixReuse: true})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	all := []int{0, 1, 2, 3, 4}
	together := decode(newEngine(2), all)
	alone := newEngine(1)
	for _, i := range all {
		want := decode(alone, []int{i})[0]
		if !slices.Equal(together[i], want) {
			t.Errorf("sampler %+v: in a batch on two threads %v\nalone on one %v", opts[i], together[i], want)
		}
	}
}

// BenchmarkBatchSampling decodes eight sequences together on a
// two-thread pool with llama-2-tiny-random's 32000-token vocabulary,
// whose tiny layers make sampling most of a step: the members sample on
// the pool's threads (ModelEngine.sample).
func BenchmarkBatchSampling(b *testing.B) {
	m := loadModelThreads(b, openShared(b, "llama-2-tiny-random.gguf"), 2)
	const members, restart = 8, 400
	for _, c := range []struct {
		name string
		opt  sample.Options
	}{
		{"greedy", sample.Options{}},
		{"T1", sample.Options{Temperature: 1}},
		{"T0.8-topP0.95", sample.Options{Temperature: 0.8, TopP: 0.95}},
	} {
		b.Run(c.name, func(b *testing.B) {
			e, err := NewModelEngine(m, ModelEngineOptions{MaxSeqs: members, Context: restart + 8, NoPrefixReuse: true})
			if err != nil {
				b.Fatal(err)
			}
			mem := make([]Member, members)
			out := make([]StepOut, members)
			for i := 0; i < b.N; i++ {
				if i%restart == 0 {
					for j := range mem {
						if i > 0 {
							e.Free(mem[j].Seq)
						}
						opt := c.opt
						opt.Seed = uint64(j)
						id, err := e.Start([]int32{1, 450, int32(4996 + j)}, sample.New(opt), "")
						if err != nil {
							b.Fatal(err)
						}
						mem[j] = Member{Seq: id, Limit: 1}
					}
				}
				if err := e.Step(context.Background(), mem, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestModelEngineErrors(t *testing.T) {
	f, _ := realModel(t)
	m := loadModel(t, f)
	e, err := NewModelEngine(m, ModelEngineOptions{MaxSeqs: 1, Context: 16})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start(nil, nil, ""); err == nil {
		t.Error("empty start accepted")
	}
	if _, err := e.Start([]int32{1, 9999}, nil, ""); err == nil {
		t.Error("token outside the vocabulary accepted")
	}
	if _, err := e.Start(make([]int32, 17), nil, ""); err == nil {
		t.Error("context overflow accepted")
	}
	id, err := e.Start([]int32{1, 2}, nil, "")
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
	if out[1].Err == nil || len(out[0].Tokens) != 1 {
		t.Errorf("unknown member: %v; known member got %v", out[1].Err, out[0].Tokens)
	}
	if err := e.Free(77); err == nil {
		t.Error("free of an unknown sequence accepted")
	}
}

// newRealScheduler runs a live scheduler on stories260K with one lane per
// entry of threads.
func newRealScheduler(t *testing.T, f *weights.File, cfg Config, maxSeqs int, threads ...int) (*Scheduler, []*ModelEngine) {
	t.Helper()
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: CPULaneSpecs(threads...), MaxSeqs: maxSeqs, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeLanes() })
	var engines []*ModelEngine
	for _, l := range lanes {
		engines = append(engines, l.Engine.(*ModelEngine))
	}
	s, err := New(cfg, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s, engines
}

// TestLiveSchedulerMatchesReference: concurrent requests through the live
// scheduler on two lanes get exactly the greedy tokens each gets alone.
func TestLiveSchedulerMatchesReference(t *testing.T) {
	f, tok := realModel(t)
	ref := loadModel(t, f)
	s, engines := newRealScheduler(t, f, Config{MaxBatch: 3}, 4, 1, 1)
	const n = 30
	var reqs []Request
	want := make([][]int32, len(testPrompts))
	for i, p := range testPrompts {
		ids := encode(t, tok, p)
		want[i] = reference(t, ref, ids, n)
		reqs = append(reqs, Request{Prompt: ids, Text: p, MaxTokens: n})
	}
	got, _ := submitAll(t, s, reqs)
	for i := range testPrompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("prompt %q: scheduled %v\nalone %v", testPrompts[i], got[i], want[i])
		}
	}
	waitFor(t, func() bool { return engines[0].Live()+engines[1].Live() == 0 })
}

// TestEvictedSegmentRebuildsExactly: a segmented request whose parked
// sequence is evicted continues, after re-prefill, with exactly the
// tokens an uninterrupted generation gives.
func TestEvictedSegmentRebuildsExactly(t *testing.T) {
	f, tok := realModel(t)
	ref := loadModel(t, f)
	s, engines := newRealScheduler(t, f, Config{}, 1, 1)
	ids := encode(t, tok, testPrompts[0])
	const n = 60
	want := reference(t, ref, ids, n)
	seg, err := NewSegmenter("statement")
	if err != nil {
		t.Fatal(err)
	}
	dec := tok.NewDecoder()
	for _, id := range ids {
		dec.Next(id)
	}
	st, err := s.Submit(context.Background(), Request{ID: "r", Prompt: ids, MaxTokens: n, Segment: seg, Decoder: dec})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	segments := 0
	for {
		toks, text, r := collect(t, st)
		got = append(got, toks...)
		if r.Reason != ReasonSegment {
			break
		}
		segments++
		if text == "" {
			t.Errorf("segment %d is empty", segments)
		}
		// Another request takes the only slot: the parked one is evicted.
		other, err := s.Submit(context.Background(), Request{Prompt: ids, MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, other)
		if st, err = s.Resume(context.Background(), "r", ResumeOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if segments < 2 {
		t.Fatalf("only %d segments in %d tokens; the test needs a story with sentences", segments, n)
	}
	if ev := s.Stats().Evicted; ev < uint64(segments) {
		t.Errorf("%d evictions for %d segments", ev, segments)
	}
	if !slices.Equal(got, want) {
		t.Errorf("segmented with evictions %v\nuninterrupted %v", got, want)
	}
	waitFor(t, func() bool { return engines[0].Live() == 0 })
}

// TestEngineHeldUntilShutdown: a scheduler holds its lanes' engines from
// New until its Shutdown returns, so a second scheduler over them (whose
// lane goroutines would drive them at the same time) is refused rather
// than racing on their KV caches; so is one engine on two lanes.
func TestEngineHeldUntilShutdown(t *testing.T) {
	f, _ := realModel(t)
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: CPULaneSpecs(1, 1), MaxSeqs: 2, Context: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	first, err := New(Config{}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}, nil, lanes[1]); !errors.Is(err, ErrEngineInUse) {
		t.Fatalf("second scheduler while the first runs: %v, want ErrEngineInUse", err)
	}
	if err := first.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}, nil, lanes[0], lanes[0]); !errors.Is(err, ErrEngineInUse) || !strings.Contains(err.Error(), "lane 1") {
		t.Fatalf("one engine on two lanes: %v, want ErrEngineInUse for lane 1", err)
	}
	// A lane that fails its checks after others were claimed gives
	// them back too.
	if _, err := New(Config{}, nil, lanes[0], Lane{Name: "none"}); err == nil || errors.Is(err, ErrEngineInUse) {
		t.Fatalf("a lane without an engine: %v, want that error", err)
	}
	// The refused News gave back what they had claimed: both engines are free.
	second, err := New(Config{}, nil, lanes...)
	if err != nil {
		t.Fatalf("after Shutdown: %v", err)
	}
	if err := second.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// decodeAlone runs one sequence of e alone for n tokens from ctx and
// frees it: the tokens, how many context tokens the engine reported
// prefilled and how many it took from a freed sequence (prefix reuse).
func decodeAlone(t *testing.T, e *ModelEngine, ctx []int32, n int) (got []int32, prefilled, reused int) {
	t.Helper()
	before := e.ReusedTokens()
	id, err := e.Start(ctx, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	reused = int(e.ReusedTokens() - before)
	out := make([]StepOut, 1)
	for len(got) < n {
		if err := e.Step(context.Background(), []Member{{Seq: id, Limit: 1}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
		prefilled += out[0].Prefilled
		got = append(got, out[0].Tokens...)
	}
	if err := e.Free(id); err != nil {
		t.Fatal(err)
	}
	return got, prefilled, reused
}

// TestModelEnginePrefixReuse: a sequence that starts with tokens a freed
// one evaluated takes its KV rows and prefills only the rest, and the
// tokens are still the reference greedy ones: a chat's next turn (the
// conversation so far, resent whole), the same prompt again, prompts
// sharing only BOS, and a context that matches nothing; and with no
// prefix cache beyond the live sequences (PrefixCache -1) the cache never
// holds more sequences than were live at once.
func TestModelEnginePrefixReuse(t *testing.T) {
	f, _ := realModel(t)
	recs := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")
	e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 2, Context: 512, PrefillChunk: 16, PrefixCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want []int32, prefilled, reused, wantReused, ctx int) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %v\nwant %v", what, got, want)
		}
		if reused != wantReused || prefilled+reused != ctx {
			t.Errorf("%s: %d context tokens reused and %d prefilled, want %d reused of %d", what, reused, prefilled, wantReused, ctx)
		}
	}
	for i, r := range recs[:3] {
		p, gen := r.PromptIDs, r.GeneratedIDs
		got, pre, re := decodeAlone(t, e, p, len(gen))
		wantRe := 0
		if i > 0 {
			wantRe = commonPrefix(p, recs[i-1].PromptIDs) // the last sequence freed holds the last prompt and its answer
		}
		check(r.Prompt+": first turn", got, gen, pre, re, wantRe, len(p))

		// The next turn resends the conversation: all but its last token
		// come from the rows the first turn left.
		turn := slices.Concat(p, gen[:100])
		got, pre, re = decodeAlone(t, e, turn, len(gen)-100)
		check(r.Prompt+": next turn", got, gen[100:], pre, re, len(turn)-1, len(turn))

		got, pre, re = decodeAlone(t, e, p, 50)
		check(r.Prompt+": again", got, gen[:50], pre, re, len(p)-1, len(p))
	}
	// No BOS: nothing matches, and the new sequence empties the kept one
	// rather than take memory for another: one sequence was live at a
	// time, and the cache holds one.
	one := e.cache.Config().SeqBytes()
	p := recs[0].PromptIDs[1:]
	want := reference(t, loadModel(t, f), p, 30)
	before := e.ReusedTokens()
	a, err := e.Start(p, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(e.kept) != 0 || e.Live() != 1 || e.ReusedTokens() != before || e.cache.Bytes() != one || e.KVBytesHeld() != one {
		t.Fatalf("%d kept, %d live, %d reused, %d bytes held (%d said); want the kept sequence emptied and taken, %d bytes", len(e.kept), e.Live(), e.ReusedTokens()-before, e.cache.Bytes(), e.KVBytesHeld(), one)
	}
	if err := e.Step(context.Background(), []Member{{Seq: a, Limit: 1}}, make([]StepOut, 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Free(a); err != nil {
		t.Fatal(err)
	}
	got, pre, re := decodeAlone(t, e, p, 30)
	check("no BOS", got, want, pre, re, len(p)-1, len(p))

	// Two at once: the first takes the kept sequence, the second a new
	// one; prefilled and freed, both are kept, and nothing is live.
	var members []Member
	for _, r := range recs[:2] {
		id, err := e.Start(r.PromptIDs, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, Member{Seq: id, Limit: 1})
	}
	if err := e.Step(context.Background(), members, make([]StepOut, 2)); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if err := e.Free(m.Seq); err != nil {
			t.Fatal(err)
		}
	}
	if e.Live() != 0 || e.KVBytesInUse() != 0 || len(e.kept) != 2 || e.cache.Bytes() != 2*one || e.KVBytesHeld() != 2*one {
		t.Fatalf("%d sequences live (%d bytes), %d kept, %d bytes held (%d said); want none live, both kept in %d bytes", e.Live(), e.KVBytesInUse(), len(e.kept), e.cache.Bytes(), e.KVBytesHeld(), 2*one)
	}
}

// TestModelEngineKeepsConversations: two clients take turns on one lane,
// one sequence live at a time, as chat users do. Within the prefix cache
// each keeps its conversation: a first turn that shares only the
// beginning with the other's conversation starts a new sequence with a
// copy of the shared rows, and each next turn reuses all but its last
// token. The same prompt again copies the prompt's rows and leaves the
// conversation for its next turn. Without a prefix cache beyond the live
// sequences the two conversations take each other's rows.
func TestModelEngineKeepsConversations(t *testing.T) {
	f, _ := realModel(t)
	recs := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")
	a, b := recs[0], recs[1]
	first := func(r testutil.Greedy) []int32 { return r.PromptIDs }
	next := func(r testutil.Greedy) []int32 { return slices.Concat(r.PromptIDs, r.GeneratedIDs[:100]) }
	turn := func(e *ModelEngine, ctx []int32, want []int32) (reused int) {
		t.Helper()
		got, prefilled, reused := decodeAlone(t, e, ctx, len(want))
		if !slices.Equal(got, want) || prefilled+reused != len(ctx) {
			t.Fatalf("%v...: got %v with %d prefilled and %d reused of %d\nwant %v", ctx[:4], got, prefilled, reused, len(ctx), want)
		}
		return reused
	}
	e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	turn(e, first(a), a.GeneratedIDs[:100])
	if got, want := turn(e, first(b), b.GeneratedIDs[:100]), commonPrefix(first(a), first(b)); got != want {
		t.Errorf("b's first turn reused %d tokens, want the %d it shares with a", got, want)
	}
	for _, r := range []testutil.Greedy{a, b} {
		if got, want := turn(e, next(r), r.GeneratedIDs[100:150]), len(next(r))-1; got != want {
			t.Errorf("next turn reused %d tokens, want %d", got, want)
		}
	}
	if got, want := turn(e, first(a), a.GeneratedIDs[:20]), len(first(a))-1; got != want {
		t.Errorf("a's prompt again reused %d tokens, want %d", got, want)
	}
	third := slices.Concat(a.PromptIDs, a.GeneratedIDs[:150])
	if got, want := turn(e, third, a.GeneratedIDs[150:170]), len(third)-1; got != want {
		t.Errorf("a's third turn reused %d tokens, want %d", got, want)
	}
	if held, want := e.KVBytesHeld(), 3*e.cache.Config().SeqBytes(); held != want {
		t.Errorf("%d bytes held, want three sequences' %d (a, b, a's prompt again)", held, want)
	}

	e, err = NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 512, PrefixCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	turn(e, first(a), a.GeneratedIDs[:100])
	turn(e, first(b), b.GeneratedIDs[:100])
	if got, want := turn(e, next(a), a.GeneratedIDs[100:150]), commonPrefix(next(a), next(b)); got != want {
		t.Errorf("without a prefix cache a's next turn reused %d tokens, want the %d it shares with b", got, want)
	}
	if held, want := e.KVBytesHeld(), e.cache.Config().SeqBytes(); held != want {
		t.Errorf("without a prefix cache %d bytes held, want one sequence's %d", held, want)
	}
}

// TestModelEngineSharesLivePrefix: clients that start together with the
// same instructions share them while all are live. A sequence starting
// while another is still prefilling copies the rows that one has
// committed so far; one starting after the other has evaluated its
// context copies all of it but its own last token. The live sequence's
// rows are copied, never taken: every sequence yields the reference
// tokens, and the lane then keeps them all for their next turns.
func TestModelEngineSharesLivePrefix(t *testing.T) {
	f, _ := realModel(t)
	r := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[0]
	ctxs := [][]int32{ // each a prefix of the next one's context, as instructions with a request after them
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:60]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:40]),
		slices.Concat(r.PromptIDs, r.GeneratedIDs[:50]),
	}
	const chunk, n = 16, 30
	check := func(l *lockstep, ctxs [][]int32) {
		t.Helper()
		l.until(n)
		for i, ctx := range ctxs {
			at := len(ctx) - len(r.PromptIDs)
			if want := r.GeneratedIDs[at : at+n]; !slices.Equal(l.got[i][:n], want) {
				t.Errorf("sequence %d: %v\nwant %v", i, l.got[i][:n], want)
			}
		}
		l.free()
	}
	e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 512, PrefillChunk: chunk})
	if err != nil {
		t.Fatal(err)
	}
	l := &lockstep{t: t, e: e, limit: 1}
	l.start(ctxs[0])
	l.step() // the first sequence has evaluated one chunk
	if got := l.start(ctxs[1]); got != chunk {
		t.Errorf("the second sequence reused %d tokens, want the first's %d evaluated so far", got, chunk)
	}
	for len(l.got[0]) == 0 {
		l.step()
	}
	if got, want := l.start(ctxs[2]), len(ctxs[2])-1; got != want {
		t.Errorf("the third sequence reused %d tokens, want %d", got, want)
	}
	check(l, ctxs)
	if held, want := e.KVBytesHeld(), 3*e.cache.Config().SeqBytes(); held != want {
		t.Errorf("%d bytes held, want three sequences' %d", held, want)
	}
	if reused, want := e.Reusable(slices.Concat(ctxs[1], l.got[1]), nil), len(ctxs[1])+len(l.got[1])-1; reused != want {
		t.Errorf("the second sequence's next turn would reuse %d tokens, want %d", reused, want)
	}

	// All three start together, the shortest first, with room in a step's
	// prefill for more than one: the others wait while it evaluates the
	// instructions they share, then copy them. The longest then leads
	// the third the same way, which prefills only its last token.
	e, err = NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 512, PrefillChunk: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctxs = [][]int32{ctxs[1], ctxs[0], ctxs[2]}
	l = &lockstep{t: t, e: e, limit: 1}
	for _, ctx := range ctxs {
		l.start(ctx)
	}
	check(l, ctxs)
	if want := len(ctxs[0]) + len(ctxs[2]) - 1; l.prefilled != len(ctxs[1])+1 || l.reused != want {
		t.Errorf("started together: %d tokens prefilled and %d copied, want %d and %d", l.prefilled, l.reused, len(ctxs[1])+1, want)
	}
}

// TestPlanStart: where a new sequence starts among kept and live
// sources. A live one is only ever copied from, and only when it shares
// more than the best kept one and the cache can copy.
func TestPlanStart(t *testing.T) {
	ctx := []int32{1, 10, 11, 12, 13, 14, 15, 16}
	for _, tc := range []struct {
		name         string
		kept, live   [][]int32
		grow, copies bool
		want         startPlan
	}{
		{"nothing", nil, nil, true, true, startPlan{take: -1, from: -1}},
		{"a live sequence alone", nil, [][]int32{ctx[:6]}, true, true, startPlan{take: -1, from: 0, have: 6}},
		{"the live one's whole context is all but the last token", nil, [][]int32{ctx}, true, true, startPlan{take: -1, from: 0, have: 7}},
		{"the longer of two live ones", nil, [][]int32{ctx[:3], {1, 10, 11, 12, 13, 99}}, true, true, startPlan{take: -1, from: 1, have: 5}},
		{"a kept next turn beats a live one", [][]int32{ctx[:6]}, [][]int32{ctx[:5]}, true, true, startPlan{take: 0, from: -1, have: 6}},
		{"a live one beats a weak kept one, which stays", [][]int32{{1, 10, 50, 51, 52}}, [][]int32{ctx[:6]}, true, true, startPlan{take: -1, from: 1, have: 6}},
		{"no room to grow: into an empty kept one", [][]int32{{1, 40}, {}}, [][]int32{ctx[:6]}, false, true, startPlan{take: 1, from: 2, have: 6}},
		{"no room to grow: into the oldest kept one", [][]int32{{1, 40}, {1, 41}}, [][]int32{ctx[:6]}, false, true, startPlan{take: 0, from: 2, have: 6}},
		{"a cache that cannot copy ignores live ones", [][]int32{{1, 10, 50}}, [][]int32{ctx[:6]}, false, false, startPlan{take: 0, from: -1, have: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := slices.Concat(tc.kept, tc.live)
			got := planStart(len(tc.kept), len(tc.live), func(i int) []int32 { return src[i] }, ctx, nil, tc.grow, tc.copies)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestModelEngineNoPrefixReuse: with NoPrefixReuse every context is
// prefilled whole and freed sequences release their slot.
func TestModelEngineNoPrefixReuse(t *testing.T) {
	f, _ := realModel(t)
	r := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[0]
	e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 1, Context: 512, NoPrefixReuse: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, pre, re := decodeAlone(t, e, r.PromptIDs, 20)
		if !slices.Equal(got, r.GeneratedIDs[:20]) || pre != len(r.PromptIDs) || re != 0 {
			t.Fatalf("got %v with %d prefilled and %d reused; want %v, %d and 0", got, pre, re, r.GeneratedIDs[:20], len(r.PromptIDs))
		}
	}
	if len(e.kept) != 0 || e.ReusedTokens() != 0 {
		t.Fatalf("%d sequences kept, %d tokens reused", len(e.kept), e.ReusedTokens())
	}
}

// BenchmarkNextTurn times a chat's next turn up to its first token: the
// conversation so far (about 390 tokens of stories260K) started again,
// prefilled whole or, with prefix reuse, from the rows the last turn
// left. go test -bench NextTurn ./runtime/sched
func BenchmarkNextTurn(b *testing.B) {
	f, _ := realModel(b)
	benchNextTurn(b, 512, func(b *testing.B, reuse bool) Engine {
		e, err := NewModelEngine(loadModel(b, f), ModelEngineOptions{MaxSeqs: 2, Context: 512, NoPrefixReuse: !reuse})
		if err != nil {
			b.Fatal(err)
		}
		return e
	})
}

// benchNextTurn runs benchFirstToken on the next turn of a stories260K
// chat (two reference answers after the first prompt, at most n tokens)
// twice: on an engine from newEngine prefilling it whole ("prefill"), and
// on one reusing the first turn's rows ("reuse").
func benchNextTurn(b *testing.B, n int, newEngine func(b *testing.B, reuse bool) Engine) {
	recs := testutil.GreedyRecords(b, "stories260K.greedy.jsonl")
	ctx := slices.Concat(recs[0].PromptIDs, recs[0].GeneratedIDs, recs[1].GeneratedIDs)
	ctx = ctx[:min(n, len(ctx))]
	for _, reuse := range []bool{false, true} {
		name := "prefill"
		if reuse {
			name = "reuse"
		}
		b.Run(name, func(b *testing.B) { benchFirstToken(b, newEngine(b, reuse), ctx) })
	}
}

// benchFirstToken starts each of ctxs on e in turn and steps it alone
// until it yields a token, then frees it: one op is a turn of every
// context (clients taking turns), after a first untimed round (the one
// that leaves rows to reuse). It reports the context tokens each op
// prefilled.
func benchFirstToken(b *testing.B, e Engine, ctxs ...[]int32) {
	out := make([]StepOut, 1)
	turn := func(ctx []int32) (prefilled int) {
		id, err := e.Start(ctx, nil, "")
		if err != nil {
			b.Fatal(err)
		}
		for out[0].Tokens = nil; len(out[0].Tokens) == 0; {
			if err := e.Step(context.Background(), []Member{{Seq: id, Limit: 1}}, out); err != nil || out[0].Err != nil {
				b.Fatal(err, out[0].Err)
			}
			prefilled += out[0].Prefilled
		}
		if err := e.Free(id); err != nil {
			b.Fatal(err)
		}
		return prefilled
	}
	for _, ctx := range ctxs {
		turn(ctx)
	}
	prefilled := 0
	for b.Loop() {
		for _, ctx := range ctxs {
			prefilled += turn(ctx)
		}
	}
	b.ReportMetric(float64(prefilled)/float64(b.N), "prefilled/op")
}

// BenchmarkClientsTakingTurns times two chat clients taking turns on one
// lane, one request at a time: an op is each client's next turn (about
// 200 tokens of conversation each) up to its first token. Without a
// prefix cache beyond the live sequence (PrefixCache -1) each turn finds
// only the other client's rows; with the default each finds its own.
// go test -bench ClientsTakingTurns ./runtime/sched
func BenchmarkClientsTakingTurns(b *testing.B) {
	f, _ := realModel(b)
	recs := testutil.GreedyRecords(b, "stories260K.greedy.jsonl")
	a := slices.Concat(recs[0].PromptIDs, recs[0].GeneratedIDs)
	c := slices.Concat(recs[1].PromptIDs, recs[1].GeneratedIDs)
	for _, keep := range []int64{-1, 0} {
		name := "no-cache"
		if keep == 0 {
			name = "prefix-cache"
		}
		b.Run(name, func(b *testing.B) {
			e, err := NewModelEngine(loadModel(b, f), ModelEngineOptions{MaxSeqs: 4, Context: 512, PrefixCache: keep})
			if err != nil {
				b.Fatal(err)
			}
			benchFirstToken(b, e, a, c)
		})
	}
}

// BenchmarkClientsStartingTogether times four clients that send their
// requests at once, each about 200 tokens of the same instructions and a
// question of its own: an op starts all four on one lane and steps them
// together until each has its first token. With prefix reuse the others
// wait while one evaluates the instructions, then copy its rows; without
// it each evaluates them. Kept sequences are trimmed between ops, so
// every op starts cold.
// go test -bench ClientsStartingTogether ./runtime/sched
func BenchmarkClientsStartingTogether(b *testing.B) {
	f, _ := realModel(b)
	recs := testutil.GreedyRecords(b, "stories260K.greedy.jsonl")
	instructions := slices.Concat(recs[0].PromptIDs, recs[0].GeneratedIDs[:195])
	var ctxs [][]int32
	for i := range 4 {
		ctxs = append(ctxs, slices.Concat(instructions, recs[1+i%(len(recs)-1)].PromptIDs[1:], []int32{int32(10 + i)}))
	}
	for _, reuse := range []bool{false, true} {
		name := "no-reuse"
		if reuse {
			name = "reuse"
		}
		b.Run(name, func(b *testing.B) {
			e, err := NewModelEngine(loadModel(b, f), ModelEngineOptions{MaxSeqs: 4, Context: 512, NoPrefixReuse: !reuse})
			if err != nil {
				b.Fatal(err)
			}
			prefilled := 0
			for b.Loop() {
				members := make([]Member, len(ctxs))
				for i, ctx := range ctxs {
					id, err := e.Start(ctx, nil, "")
					if err != nil {
						b.Fatal(err)
					}
					members[i] = Member{Seq: id, Limit: 1}
				}
				out := make([]StepOut, len(members))
				for waiting := len(members); waiting > 0; {
					if err := e.Step(context.Background(), members, out); err != nil {
						b.Fatal(err)
					}
					for i, o := range out {
						if o.Err != nil {
							b.Fatal(o.Err)
						}
						prefilled += o.Prefilled
						if len(o.Tokens) > 0 && members[i].Limit > 0 {
							members[i].Limit, waiting = 0, waiting-1
						}
					}
				}
				for _, m := range members {
					if err := e.Free(m.Seq); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := e.TrimKV(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(prefilled)/float64(b.N), "prefilled/op")
		})
	}
}

// FuzzPrefixReuse drives two engines on stories260K, one with prefix
// reuse and one without, through the same starts, steps and frees, with
// contexts cut from earlier ones and their answers (so they share
// prefixes of every length): each sequence must yield the same tokens on
// both (the engine with reuse may yield them steps earlier, having less
// to prefill, or later, having waited to copy a live sequence's rows),
// and each context's tokens are either prefilled or reused.
func FuzzPrefixReuse(f *testing.F) {
	f.Add([]byte{0, 0, 4, 1, 1, 1, 1, 2, 0, 0, 1, 9, 3, 1, 1, 2, 0})
	f.Add([]byte{0, 0, 5, 0, 0, 3, 1, 1, 1, 2, 1, 0, 2, 40, 1, 1, 2, 0, 0, 1, 30, 1, 1})
	file, _ := realModel(f)
	models := []*model.Model{loadModel(f, file), loadModel(f, file)}
	base := testutil.GreedyRecords(f, "stories260K.greedy.jsonl")[0].PromptIDs
	f.Fuzz(func(t *testing.T, ops []byte) {
		const ctxLen = 96
		// The first byte's low bit also picks the reusing engine's prefix
		// cache: room to keep sequences beside the live ones (copying
		// shared rows into new ones), or none.
		keep := int64(0)
		if len(ops) > 0 && ops[0]%2 == 1 {
			keep = -1
		}
		var engines [2]*ModelEngine
		for i, m := range models {
			e, err := NewModelEngine(m, ModelEngineOptions{MaxSeqs: 3, Context: ctxLen, PrefillChunk: 7, NoPrefixReuse: i == 1, PrefixCache: keep})
			if err != nil {
				t.Fatal(err)
			}
			engines[i] = e
		}
		type live struct {
			ids       [2]SeqID
			ctx       []int32
			out       [2][]int32 // each engine's answer so far
			prefilled [2]int
			reused    int
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
			// Freed mid-prefill (cancelled), a context is partly evaluated;
			// the engine with reuse may be behind, having waited for a live
			// sequence to evaluate what they share.
			if n, with := len(s.ctx), s.prefilled[0]+s.reused; s.prefilled[1] > n || with > n || len(s.out[0]) > 0 && with != n {
				t.Fatalf("a context of %d tokens: %d prefilled and %d reused with reuse, %d prefilled without", n, s.prefilled[0], s.reused, s.prefilled[1])
			}
			script.finished(s.ctx, s.out[0][:min(len(s.out[0]), len(s.out[1]))])
			seqs = slices.Delete(seqs, i, i+1)
		}
		for script.more() {
			switch script.next() % 3 {
			case 0: // start a context cut from the pool, maybe with a token of its own
				if len(seqs) == 3 {
					continue
				}
				ctx := script.context(ctxLen / 2)
				s := &live{ctx: ctx}
				before := engines[0].ReusedTokens()
				for k, e := range engines {
					id, err := e.Start(ctx, nil, "")
					if err != nil {
						t.Fatal(err)
					}
					s.ids[k] = id
				}
				s.reused = int(engines[0].ReusedTokens() - before)
				seqs = append(seqs, s)
			case 1: // step every live sequence together, a few times
				for range 1 + int(script.next())%4 {
					if len(seqs) == 0 {
						break
					}
					var outs [2][]StepOut
					for k, e := range engines {
						members := make([]Member, len(seqs))
						for i, s := range seqs {
							members[i] = Member{Seq: s.ids[k], Limit: 1}
						}
						outs[k] = make([]StepOut, len(seqs))
						if err := e.Step(context.Background(), members, outs[k]); err != nil {
							t.Fatal(err)
						}
					}
					for i, s := range seqs {
						for k := range engines {
							if err := outs[k][i].Err; err != nil {
								t.Fatal(err)
							}
							s.prefilled[k] += outs[k][i].Prefilled
							s.out[k] = append(s.out[k], outs[k][i].Tokens...)
							if k == 0 {
								s.reused += outs[k][i].Reused // caught up from a live sequence
							}
						}
						n := min(len(s.out[0]), len(s.out[1]))
						if !slices.Equal(s.out[0][:n], s.out[1][:n]) {
							t.Fatalf("sequence %d from %v: with reuse %v, without %v", i, s.ctx, s.out[0], s.out[1])
						}
					}
					for i := len(seqs) - 1; i >= 0; i-- {
						if s := seqs[i]; len(s.ctx)+max(len(s.out[0]), len(s.out[1])) >= ctxLen-1 {
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
			// Still prefilling ones have not reported every token: step
			// them out first so the accounting holds.
			s := seqs[0]
			for s.prefilled[1] < len(s.ctx) {
				var out [1]StepOut
				for k, e := range engines {
					if err := e.Step(context.Background(), []Member{{Seq: s.ids[k], Limit: 1}}, out[:]); err != nil || out[0].Err != nil {
						t.Fatal(err, out[0].Err)
					}
					s.prefilled[k] += out[0].Prefilled
					if k == 0 {
						s.reused += out[0].Reused
					}
				}
			}
			free(0)
		}
		if engines[0].Live() != 0 || engines[1].Live() != 0 {
			t.Fatalf("%d and %d sequences live after freeing all", engines[0].Live(), engines[1].Live())
		}
	})
}

// TestModelEngineReusable: what Reusable says a Start would take from
// kept rows is what Start then takes.
func TestModelEngineReusable(t *testing.T) {
	f, _ := realModel(t)
	r := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[0]
	e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 2, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	p, gen := r.PromptIDs, r.GeneratedIDs
	if n := e.Reusable(p, nil); n != 0 {
		t.Fatalf("nothing kept, yet %d reusable", n)
	}
	decodeAlone(t, e, p, 20) // keeps the prompt and 19 answer tokens' rows
	for _, c := range []struct {
		prompt, generated []int32
		want              int
	}{
		{p, nil, len(p) - 1},                                // all but the last token, which is evaluated again
		{p, gen[:10], len(p) + 9},                           // a rebuild: prompt and what it generated
		{slices.Concat(p, gen[:5]), gen[5:30], len(p) + 19}, // past the kept rows
		{p[:2], nil, 1},
		{p[1:], nil, 0}, // no BOS
	} {
		if got := e.Reusable(c.prompt, c.generated); got != c.want {
			t.Errorf("Reusable(%d prompt tokens, %d generated) = %d, want %d", len(c.prompt), len(c.generated), got, c.want)
		}
	}
	ctx := slices.Concat(p, gen[:5], gen[5:30])
	want := e.Reusable(ctx, nil)
	if _, _, reused := decodeAlone(t, e, ctx, 1); reused != want {
		t.Errorf("Start reused %d tokens, Reusable said %d", reused, want)
	}
}

// TestParsePrefixCache: sizes as users write them; 0 is no cache beyond
// the live sequences, the options' -1 (their 0 is the default).
func TestParsePrefixCache(t *testing.T) {
	for in, want := range map[string]int64{"256MiB": 256 << 20, "1.5KB": 1500, "0": -1, "0MiB": -1, "12": 12} {
		if got, err := ParsePrefixCache(in); err != nil || got != want {
			t.Errorf("ParsePrefixCache(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1MiB", "lots", "NaN", "1e30GiB"} {
		if got, err := ParsePrefixCache(in); err == nil {
			t.Errorf("ParsePrefixCache(%q) = %d, want an error", in, got)
		}
	}
}

// TestTrimMemory: Scheduler.TrimMemory gives back every lane's kept
// sequences and spare buffers while a request runs, without touching
// it: the running request still gets the reference tokens, the memory
// held falls to its one sequence, and a next turn after the trim
// prefills its whole context. After Shutdown it refuses.
func TestTrimMemory(t *testing.T) {
	f, _ := realModel(t)
	s, engines := newRealScheduler(t, f, Config{MaxBatch: 4}, 4, 1, 1)
	recs := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")
	for _, r := range recs[:3] { // finished: kept for reuse, on either lane
		if got, _, _ := collect(t, submit(t, s, Request{Prompt: r.PromptIDs, MaxTokens: 40})); !slices.Equal(got, r.GeneratedIDs[:40]) {
			t.Fatalf("%v, want %v", got, r.GeneratedIDs[:40])
		}
	}
	var held int64
	for _, e := range engines {
		held += e.KVBytesHeld()
	}
	r := recs[3]
	st := submit(t, s, Request{Prompt: r.PromptIDs, MaxTokens: len(r.GeneratedIDs)})
	ev, err := st.Recv(context.Background()) // running now
	if err != nil {
		t.Fatal(err)
	}
	released, err := s.TrimMemory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rest, _, _ := collect(t, st)
	if got := slices.Concat(ev.Tokens, rest); !slices.Equal(got, r.GeneratedIDs) {
		t.Errorf("the request running through the trim got %v\nwant %v", got, r.GeneratedIDs)
	}
	one := engines[0].cache.Config().SeqBytes()
	var after int64
	for _, e := range engines {
		after += e.KVBytesHeld()
	}
	// The running sequence's memory stays, and with it the kept sequence
	// it became; nothing else.
	if released <= 0 || released > held || after != one {
		t.Errorf("released %d of %d bytes held, %d held after; want some released and one sequence's %d held", released, held, after, one)
	}
	reused := func() (n int64) {
		for _, e := range engines {
			n += e.ReusedTokens()
		}
		return n
	}
	before := reused()
	next := slices.Concat(recs[0].PromptIDs, recs[0].GeneratedIDs[:40])
	if got, _, res := collect(t, submit(t, s, Request{Prompt: next, MaxTokens: 20})); !slices.Equal(got, recs[0].GeneratedIDs[40:60]) {
		t.Errorf("next turn after the trim %v (%+v)\nwant %v", got, res, recs[0].GeneratedIDs[40:60])
	}
	// Only what it shares with the one sequence left can be reused.
	if got, most := reused()-before, commonPrefix(next, r.PromptIDs); got > int64(most) {
		t.Errorf("the next turn after the trim reused %d tokens; at most %d are left to reuse", got, most)
	}
	s.Shutdown(context.Background())
	if _, err := s.TrimMemory(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("TrimMemory after Shutdown: %v, want ErrClosed", err)
	}
}

// failingCopyRows is a kv.Rows whose copies between sequences fail, as a
// device's might part way.
type failingCopyRows struct{}

func (failingCopyRows) Alloc(int) error              { return nil }
func (failingCopyRows) Free(int)                     {}
func (failingCopyRows) Move(int, []int, []int) error { return nil }
func (failingCopyRows) CopyRows(int, int, int) error { return errors.New("device lost") }

// TestStartCopyFailure: when copying a kept sequence's shared rows fails,
// Start fails, and the sequence the copy was writing is freed, kept or
// new: rows a copy left part way must never be reused.
func TestStartCopyFailure(t *testing.T) {
	f, _ := realModel(t)
	for _, keep := range []int64{0, -1} { // into a new sequence; into the oldest kept one
		e, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 64, PrefixCache: keep})
		if err != nil {
			t.Fatal(err)
		}
		cfg := e.cache.Config()
		cfg.Rows = failingCopyRows{}
		if e.cache, err = kv.New(cfg); err != nil {
			t.Fatal(err)
		}
		// Two kept sequences: the oldest holds 5 unrelated tokens, the
		// other 30 that share their first 10 with the new context.
		long := prompt(30)
		for _, toks := range [][]int32{{1, 99, 98, 97, 96}, long} {
			id, _ := e.cache.NewSeq()
			e.cache.Reserve(id, len(toks))
			e.cache.CommitAll(id)
			e.kept = append(e.kept, keptSeq{id: id, tokens: toks})
		}
		ctx := append(slices.Clone(long[:10]), 7, 8, 9)
		if _, err := e.Start(ctx, nil, ""); err == nil {
			t.Fatalf("PrefixCache %d: Start succeeded with a failing copy", keep)
		}
		allocated := 0
		for id := range 4 {
			if e.cache.Valid(id) {
				allocated++
			}
		}
		wantKept := 2 // the new sequence is freed
		if keep < 0 {
			wantKept = 1 // the oldest kept one, the copy's target, is freed
		}
		if len(e.kept) != wantKept || allocated != wantKept || e.Live() != 0 || !slices.Equal(e.kept[len(e.kept)-1].tokens, long) {
			t.Errorf("PrefixCache %d: after the failed copy %d kept (the last %v), %d sequences allocated, %d live; want %d kept, the source last",
				keep, len(e.kept), e.kept[len(e.kept)-1].tokens, allocated, e.Live(), wantKept)
		}
	}
}

// TestCatchUpCopyFailure: a copy that fails part way while a waiting
// sequence catches up (a device copy can) leaves rows that match no
// tokens; the sequence must prefill its whole context instead of
// trusting them, on both engines. The failing copy here writes another
// sequence's rows first, so trusting them would change the tokens.
func TestCatchUpCopyFailure(t *testing.T) {
	f, _ := realModel(t)
	recs := greedyRecords(t, 120)
	r, other := recs[0], recs[1]
	long := slices.Concat(r.PromptIDs, r.GeneratedIDs[:40])
	short := slices.Concat(r.PromptIDs, r.GeneratedIDs[:30])
	unrelated := slices.Concat(other.PromptIDs, other.GeneratedIDs[:40])
	const n = 20
	for _, speculative := range []bool{false, true} {
		var e interface {
			Engine
			ReusedTokens() int64
		}
		var failing *func(c *kv.Cache, dst, src, n int) error
		if speculative {
			se, err := NewSpecEngine(loadShared(t, "llama2xs_model.bin"), loadShared(t, "stories260K.bin"),
				spec.Config{Method: spec.Tree, MaxTree: 12, Trigger: spec.FixedSize{N: 12}}, SpecEngineOptions{MaxSeqs: 4, Context: specContext})
			if err != nil {
				t.Fatal(err)
			}
			e, failing = se, &se.copyPrefix
		} else {
			me, err := NewModelEngine(loadModel(t, f), ModelEngineOptions{MaxSeqs: 4, Context: 256})
			if err != nil {
				t.Fatal(err)
			}
			e, failing = me, &me.copyPrefix
		}
		l := &lockstep{t: t, e: e, limit: 1}
		l.start(unrelated)
		for len(l.got[0]) == 0 {
			l.step()
		}
		l.start(long)
		l.start(short) // waits for long, then copies its rows: fails
		src := l.ids[0]
		// From now on every copy writes the unrelated sequence's rows,
		// then fails.
		*failing = func(c *kv.Cache, dst, _, n int) error {
			c.CopyPrefix(dst, int(src), min(n, c.Len(int(src))))
			return errors.New("device copy failed")
		}
		if speculative {
			// The speculative engine's sequence ids are its own; its
			// decoders' caches hold the rows.
			se := e.(*SpecEngine)
			h, _ := se.seqs[src].dec.Rows()
			*failing = func(c *kv.Cache, dst, _, n int) error {
				from := h.Target
				if c == se.dcache {
					from = h.Draft
				}
				c.CopyPrefix(dst, from, min(n, c.Len(from)))
				return errors.New("device copy failed")
			}
		}
		l.until(n)
		for i, want := range [][]int32{other.GeneratedIDs[40 : 40+n], r.GeneratedIDs[40 : 40+n], r.GeneratedIDs[30 : 30+n]} {
			if !slices.Equal(l.got[i][:n], want) {
				t.Errorf("speculative %v: sequence %d: %v\nwant %v", speculative, i, l.got[i][:n], want)
			}
		}
		if l.reused > 0 {
			t.Errorf("speculative %v: %d tokens reported copied by copies that failed", speculative, l.reused)
		}
		l.free()
	}
}

// TestSubmitRefusesIdsOutsideTheVocabulary: Submit says a prompt id the
// model has no row for is invalid, as its doc says, and queues nothing;
// the request used to queue and end in an error from the engine's Start.
// A speculative lane reports its target's vocabulary too.
func TestSubmitRefusesIdsOutsideTheVocabulary(t *testing.T) {
	if v := newSpecEngine(t, spec.Config{}, 1).Info().Vocab; v != 512 {
		t.Errorf("a speculative lane reports a vocabulary of %d, want its target's 512", v)
	}
	f, _ := realModel(t)
	s, _ := newRealScheduler(t, f, Config{}, 2, 1)
	for _, p := range [][]int32{{1, 512}, {1, -3}, {99999}} {
		st, err := s.Submit(context.Background(), Request{Prompt: p, MaxTokens: 2})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "outside the vocabulary of 512") {
			t.Errorf("prompt %v: %v, %v; want ErrInvalid naming the vocabulary", p, st, err)
		}
	}
	if st := s.Stats(); st.Admitted != 0 {
		t.Errorf("%d requests admitted", st.Admitted)
	}
	if _, _, r := collect(t, submit(t, s, Request{Prompt: []int32{1, 511}, MaxTokens: 2})); r.TotalGenerated != 2 {
		t.Errorf("the vocabulary's last id: %d tokens, want 2", r.TotalGenerated)
	}
}
