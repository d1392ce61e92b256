package model

import (
	"fmt"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// TestDecodeAllocatesNothing holds a batched decode step (Forward over
// several sequences and the commit of its rows) to zero heap
// allocations once the buffers have grown: a server decodes thousands of
// steps a second, and garbage per step makes the collector run every few
// hundred milliseconds, stealing cycles from decoding and stalling the
// scheduler's goroutines in allocation assists. Quantized weights take
// the activation quantizer's path; two threads take the pool's workers.
func TestDecodeAllocatesNothing(t *testing.T) {
	for _, typ := range []weights.DType{weights.F32, weights.Q8_0} {
		m := loadConverted(t, "stories260K.bin", typ) // two threads
		t.Run(typ.String(), func(t *testing.T) {
			backends(t, func(t *testing.T) {
				if raceEnabled && (typ != weights.F32 || kernels.Backend() == "go") {
					// Quantized activations and the Go matmul's row
					// scratch come from sync.Pools; the runs without
					// -race (pure Go, arm64) check these paths.
					t.Skip("the race detector makes sync.Pool drop items")
				}
				const seqs = 8 // a full batch at the scheduler's default
				cache := newCache(t, m, 256)
				var b Batch
				var out Logits
				prompt := []int32{1, 403, 407, 261, 378, 275, 266, 405}
				ids := make([]int, seqs)
				for i := range ids {
					ids[i] = newSeq(t, cache)
					b.Chain(prompt[:2+i%4], 0, ids[i], -1, false)
				}
				if err := m.Forward(&b, cache, &out); err != nil {
					t.Fatal(err)
				}
				step := func() {
					b.Reset()
					for i, s := range ids {
						b.Add(int32(300+i), int32(cache.Len(s)), s, -1, true)
					}
					if err := m.Forward(&b, cache, &out); err != nil {
						t.Fatal(err)
					}
					for _, s := range ids {
						if err := cache.CommitAll(s); err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, s := range ids {
					if err := cache.CommitAll(s); err != nil {
						t.Fatal(err)
					}
				}
				step() // grows the decode buffers
				// Each step lengthens the sequences: attention's scores
				// grow too, and must not be reallocated each time.
				if got := testing.AllocsPerRun(100, step); got != 0 {
					t.Errorf("a decode step of %d sequences allocates %v times, want 0", seqs, got)
				}
			})
		})
	}
}

// BenchmarkDecodeStep times one decode step of stories260K (a model the
// size of a draft) and of the embedded target on one and two threads for
// a batch of sequences 128 tokens in, dropping the step's rows after each
// so every iteration attends over the same length.
func BenchmarkDecodeStep(b *testing.B) {
	for _, threads := range []int{1, 2} {
		m := loadConvertedThreads(b, "stories260K.bin", weights.F32, threads)
		for _, seqs := range []int{1, 8} {
			b.Run(fmt.Sprintf("threads=%d/seqs=%d", threads, seqs), func(b *testing.B) {
				benchDecodeStep(b, m, seqs)
			})
		}
	}
	// The embedded target (Q8_0, dim 192), what generate and serve run
	// with no files: small enough that the pool's hand-off, attention's
	// per-call costs and how little a batch saves with the weights in
	// cache all show.
	for _, threads := range []int{1, 2} {
		f, err := defaultmodel.Target()
		if err != nil {
			b.Fatal(err)
		}
		m := loadThreads(b, f, threads)
		for _, seqs := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("embedded/threads=%d/seqs=%d", threads, seqs), func(b *testing.B) {
				benchDecodeStep(b, m, seqs)
			})
		}
	}
}

func benchDecodeStep(b *testing.B, m *Model, seqs int) {
	const pos = 128
	cache := newCache(b, m, 256)
	var batch Batch
	var out Logits
	ids := make([]int, seqs)
	for i := range ids {
		ids[i] = newSeq(b, cache)
		prompt := make([]int32, pos)
		for p := range prompt {
			prompt[p] = int32(300 + (p+i)%100)
		}
		batch.Chain(prompt, 0, ids[i], -1, false)
		if err := m.Forward(&batch, cache, &out); err != nil {
			b.Fatal(err)
		}
		if err := cache.CommitAll(ids[i]); err != nil {
			b.Fatal(err)
		}
		batch.Reset()
	}
	for b.Loop() {
		batch.Reset()
		for i, s := range ids {
			batch.Add(int32(300+i), pos, s, -1, true)
		}
		if err := m.Forward(&batch, cache, &out); err != nil {
			b.Fatal(err)
		}
		for _, s := range ids {
			cache.DropAfter(s, 0)
		}
	}
}
