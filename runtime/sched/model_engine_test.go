package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

// realModel opens stories260K.gguf with its tokenizer.
func realModel(t *testing.T) (*weights.File, *tokenizer.Tokenizer) {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromMetadata(&f.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	return f, tok
}

func loadModel(t *testing.T, f *weights.File) *model.Model {
	t.Helper()
	m, err := model.Load(f, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
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
	seqs := make([]SeqID, len(prompts))
	active := map[int]bool{}
	start := func(i int) {
		id, err := e.Start(prompts[i], nil, "")
		if err != nil {
			t.Fatal(err)
		}
		seqs[i] = id
		active[i] = true
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
		if prefilled[i] != len(prompts[i]) {
			t.Errorf("prompt %q: %d tokens reported prefilled, the prompt has %d", testPrompts[i], prefilled[i], len(prompts[i]))
		}
	}
	if e.Live() != 0 {
		t.Errorf("%d sequences still live", e.Live())
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
	var wg sync.WaitGroup
	got := make([][]int32, len(testPrompts))
	want := make([][]int32, len(testPrompts))
	for i, p := range testPrompts {
		ids := encode(t, tok, p)
		want[i] = reference(t, ref, ids, n)
		st, err := s.Submit(context.Background(), Request{Prompt: ids, Text: p, MaxTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[i], _, err = recvAll(st); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
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
