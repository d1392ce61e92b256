package spec

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/weights"
)

type arRecord = testutil.Greedy

func arRecords(t testing.TB, name string) []arRecord {
	return testutil.GreedyRecords(t, name)
}

func arLoadModel(t testing.TB, name string) *model.Model {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, name))
	return arLoadFile(t, f, err)
}

// arLoadFile loads an opened (or parsed) weights file; model and file
// are closed when the test ends.
func arLoadFile(t testing.TB, f *weights.File, err error) *model.Model {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Threads: 2})
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

func arNewCache(t testing.TB, m *model.Model, context int) *kv.Cache {
	t.Helper()
	c, err := m.NewCache(context, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func arIsBOS(id int32) bool { return id == 1 }

// TestGenerateParity: the plain loop reproduces the reference greedy
// streams (200 positions, ending early at BOS), with the prompt prefilled
// in one chunk and in chunks of 3.
func TestGenerateParity(t *testing.T) {
	for _, tc := range []struct{ model, refs string }{
		{"stories260K.bin", "stories260K.greedy.jsonl"},
		{"stories260K.gguf", "stories260K.greedy.jsonl"},
		{"llama2xs_model.bin", "llama2xs.greedy.jsonl"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m := arLoadModel(t, tc.model)
			cache := arNewCache(t, m, 200)
			for _, chunk := range []int{0, 3} {
				for ri, r := range arRecords(t, tc.refs) {
					var streamed []int32
					res, err := Generate(context.Background(), m, cache, r.PromptIDs, GenOptions{
						MaxTokens: 201 - len(r.PromptIDs),
						Stop:      arIsBOS,
						OnToken:   func(id int32) error { streamed = append(streamed, id); return nil },
						ChunkSize: chunk,
					})
					if err != nil {
						t.Fatalf("chunk %d record %d: %v", chunk, ri, err)
					}
					if !slices.Equal(res.Ids, r.GeneratedIDs) {
						t.Fatalf("chunk %d record %d (%q):\n got %v\nwant %v", chunk, ri, r.Prompt, res.Ids, r.GeneratedIDs)
					}
					wantReason := StopMaxTokens
					if last := r.GeneratedIDs[len(r.GeneratedIDs)-1]; last == 1 {
						wantReason = StopToken
						if !slices.Equal(streamed, res.Ids[:len(res.Ids)-1]) {
							t.Fatalf("OnToken saw %v, want the ids without the stop id", streamed)
						}
					}
					if res.Reason != wantReason || res.PromptTokens != len(r.PromptIDs) {
						t.Fatalf("record %d: reason %v, prompt tokens %d; want %v, %d", ri, res.Reason, res.PromptTokens, wantReason, len(r.PromptIDs))
					}
					if cache.Valid(0) {
						t.Fatal("Generate left its sequence allocated")
					}
				}
			}
		})
	}
}

func TestGenerateContextFull(t *testing.T) {
	m := arLoadModel(t, "stories260K.bin")
	rec := arRecords(t, "stories260K.greedy.jsonl")[0]
	prompt := rec.PromptIDs[:4]
	full, err := Generate(context.Background(), m, arNewCache(t, m, 64), prompt, GenOptions{MaxTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	// A cache of 10 rows holds the 4 prompt tokens and 6 generated ones;
	// the token sampled after the last row is still returned.
	res, err := Generate(context.Background(), m, arNewCache(t, m, 10), prompt, GenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != StopContextFull || !slices.Equal(res.Ids, full.Ids[:7]) {
		t.Fatalf("reason %v ids %v; want %v and %v", res.Reason, res.Ids, StopContextFull, full.Ids[:7])
	}
	// MaxTokens far beyond any context ends there too; it used to reserve
	// room for every token it asked for (8 GB for two billion).
	res, err = Generate(context.Background(), m, arNewCache(t, m, 10), prompt, GenOptions{MaxTokens: math.MaxInt / 8})
	if err != nil || res.Reason != StopContextFull || !slices.Equal(res.Ids, full.Ids[:7]) {
		t.Fatalf("a huge MaxTokens: reason %v ids %v, %v; want %v and %v", res.Reason, res.Ids, err, StopContextFull, full.Ids[:7])
	}
	_, err = Generate(context.Background(), m, arNewCache(t, m, 3), prompt, GenOptions{})
	if !errors.Is(err, kv.ErrContextFull) {
		t.Fatalf("prompt longer than the cache: %v, want kv.ErrContextFull", err)
	}
}

func TestGenerateErrors(t *testing.T) {
	m := arLoadModel(t, "stories260K.bin")
	cache := arNewCache(t, m, 32)
	prompt := []int32{1, 403, 407}
	boom := errors.New("client went away")
	for _, tc := range []struct {
		name   string
		ctx    func() context.Context
		prompt []int32
		opt    GenOptions
		is     error
		ids    int
	}{
		{name: "empty prompt", prompt: nil},
		{name: "negative max tokens", prompt: prompt, opt: GenOptions{MaxTokens: -1}},
		{name: "negative chunk", prompt: prompt, opt: GenOptions{ChunkSize: -1}},
		{name: "token outside vocab", prompt: []int32{1, 9999}},
		{name: "OnToken error", prompt: prompt, opt: GenOptions{MaxTokens: 5, OnToken: func(id int32) error { return boom }}, is: boom, ids: 1},
		{name: "canceled", prompt: prompt, ctx: func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, is: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			res, err := Generate(ctx, m, cache, tc.prompt, tc.opt)
			if err == nil {
				t.Fatal("Generate succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("error %v, want %v", err, tc.is)
			}
			if len(res.Ids) != tc.ids {
				t.Fatalf("%d ids returned, want %d", len(res.Ids), tc.ids)
			}
			if cache.Valid(0) {
				t.Fatal("Generate left its sequence allocated")
			}
		})
	}
}

func TestGenerateSampled(t *testing.T) {
	m := arLoadModel(t, "stories260K.bin")
	cache := arNewCache(t, m, 64)
	prompt := []int32{1, 403, 407}
	run := func(seed uint64) []int32 {
		s := sample.New(sample.Options{Temperature: 0.9, TopP: 0.95, Seed: seed})
		res, err := Generate(context.Background(), m, cache, prompt, GenOptions{MaxTokens: 30, Sampler: s})
		if err != nil {
			t.Fatal(err)
		}
		return res.Ids
	}
	a, b, c := run(1), run(1), run(2)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different runs:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("seeds 1 and 2 gave the same 30 tokens %v", a)
	}
}
