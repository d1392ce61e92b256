package model

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// sameLogits demands the same bits: every kernel is batch-invariant (a
// vector's outputs do not depend on the batch it is in), which is what
// lets a verified tree emit exactly the tokens one-at-a-time decode would.
func sameLogits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%s: %d logits, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: logit %d = %v, want %v (differ by %.3g; a batch changed the arithmetic)", what, i, got[i], want[i], got[i]-want[i])
		}
	}
}

func copyRow(out *Logits, slot int) []float32 { return append([]float32(nil), out.Row(slot)...) }

func newCache(t testing.TB, m *Model, context int) *kv.Cache {
	t.Helper()
	c, err := m.NewCache(context, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newSeq(t testing.TB, c *kv.Cache) int {
	t.Helper()
	s, err := c.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stepwise feeds tokens one Forward each and returns every step's logits
// and the logits of decoding next after them.
func stepwise(t *testing.T, m *Model, tokens []int32, next int32) ([][]float32, []float32) {
	t.Helper()
	cache := newCache(t, m, max(64, len(tokens)+1))
	seq := newSeq(t, cache)
	var b Batch
	var out Logits
	var rows [][]float32
	for i, tok := range append(append([]int32(nil), tokens...), next) {
		b.Reset()
		b.Add(tok, int32(i), seq, -1, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		if err := cache.CommitAll(seq); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, copyRow(&out, 0))
	}
	return rows[:len(tokens)], rows[len(tokens)]
}

// TestBatchSemantics checks the one rule of Forward: a chain in one batch,
// token-by-token decoding and a tree whose chosen path is committed all
// give the same logits, bit for bit, and so do several sequences sharing
// a batch: with float weights and with quantized ones (whose kernels
// take other paths for one vector and for several), on every backend.
func TestBatchSemantics(t *testing.T) {
	for _, typ := range []weights.DType{weights.F32, weights.Q8_0, weights.Q4_0} {
		m := loadConverted(t, "stories260K.bin", typ)
		t.Run(typ.String(), func(t *testing.T) {
			backends(t, func(t *testing.T) { batchSemantics(t, m) })
		})
	}
}

func batchSemantics(t *testing.T, m *Model) {
	prompt := []int32{1, 403, 407, 261, 378, 275, 266, 405, 29, 400, 395, 279}
	var next int32 = 300

	steps, after := stepwise(t, m, prompt, next)

	t.Run("chain", func(t *testing.T) {
		cache := newCache(t, m, 64)
		seq := newSeq(t, cache)
		var b Batch
		var out Logits
		for i, tok := range prompt {
			b.Add(tok, int32(i), seq, i-1, true)
		}
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		for i := range prompt {
			sameLogits(t, "chain slot", out.Row(i), steps[i])
		}
	})

	t.Run("tree", func(t *testing.T) {
		cache := newCache(t, m, 64)
		seq := newSeq(t, cache)
		// Commit the first 4 tokens, then verify a tree over the rest:
		// the chain prompt[4:], with distractor branches hanging off
		// it and a second root, interleaved so that chain slots are not
		// contiguous.
		var b Batch
		var out Logits
		b.Chain(prompt[:4], 0, seq, -1, false)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		cache.CommitAll(seq)
		b.Reset()
		var chain []int // slots of the chosen path
		parent := -1
		for i, tok := range prompt[4:] {
			pos := int32(4 + i)
			if i%2 == 1 {
				// A distractor sibling before the chain slot and a child
				// of it, so the path skips slots.
				d := b.Add((tok+7)%512, pos, seq, parent, true)
				b.Add((tok+11)%512, pos+1, seq, d, true)
			}
			parent = b.Add(tok, pos, seq, parent, true)
			chain = append(chain, parent)
			if i == 2 {
				b.Add(5, 4, seq, -1, true) // another root
			}
		}
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		for i, slot := range chain {
			sameLogits(t, "tree path slot", out.Row(slot), steps[4+i])
		}
		if got := cache.Tentative(seq); got != b.Len() {
			t.Fatalf("tentative rows %d, want one per slot (%d)", got, b.Len())
		}
		// Tentative rows of this sequence are numbered in slot order.
		if err := cache.Commit(seq, chain); err != nil {
			t.Fatal(err)
		}
		if cache.Len(seq) != len(prompt) || cache.Tentative(seq) != 0 {
			t.Fatalf("after commit: %d committed, %d tentative; want %d, 0", cache.Len(seq), cache.Tentative(seq), len(prompt))
		}
		b.Reset()
		b.Add(next, int32(len(prompt)), seq, -1, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		sameLogits(t, "decode after commit", out.Row(0), after)
	})

	t.Run("tree grown over calls", func(t *testing.T) {
		// The same path as above, but grown one level per Forward with
		// AddAfter, with a distractor branch per level; then CommitKeep
		// keeps what was grown below the committed path.
		cache := newCache(t, m, 64)
		seq := newSeq(t, cache)
		var b Batch
		var out Logits
		b.Chain(prompt[:4], 0, seq, -1, false)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		cache.CommitAll(seq)
		var path []int // tentative rows of the chosen path
		tip := -1
		for i, tok := range prompt[4:] {
			pos := int32(4 + i)
			b.Reset()
			base := cache.Tentative(seq)
			d := b.AddAfter((tok+7)%512, pos, seq, tip, true) // distractor
			b.Add((tok+11)%512, pos+1, seq, d, true)          // and its child
			slot := b.AddAfter(tok, pos, seq, tip, true)
			if err := m.Forward(&b, cache, &out); err != nil {
				t.Fatalf("level %d: %v", i, err)
			}
			sameLogits(t, "grown path slot", out.Row(slot), steps[4+i])
			if got := cache.Parent(seq, base+slot); got != tip {
				t.Fatalf("level %d: row %d follows %d, want %d", i, base+slot, got, tip)
			}
			tip = base + slot
			path = append(path, tip)
		}
		// One more level below the path's end, kept by CommitKeep.
		b.Reset()
		b.AddAfter(next, int32(len(prompt)), seq, tip, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		sameLogits(t, "grown below the path", out.Row(0), after)
		remap, err := cache.CommitKeep(seq, path, cache.Tentative(seq)-1)
		if err != nil {
			t.Fatal(err)
		}
		if cache.Len(seq) != len(prompt) || cache.Tentative(seq) != 1 || remap[len(remap)-1] != 0 {
			t.Fatalf("after CommitKeep: %d committed, %d tentative, remap %v", cache.Len(seq), cache.Tentative(seq), remap)
		}
		// The kept row now follows the tip: a decode step under it sees
		// the prompt and `next`, exactly as a plain decode would.
		b.Reset()
		b.AddAfter(7, int32(len(prompt)+1), seq, 0, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		_, twoAfter := stepwise(t, m, append(append([]int32(nil), prompt...), next), 7)
		sameLogits(t, "decode under the kept row", out.Row(0), twoAfter)
	})

	t.Run("sequences", func(t *testing.T) {
		// Three sequences prefilled in one interleaved batch, then one
		// decode step each in one batch, against each alone.
		prompts := [][]int32{prompt, prompt[:5], {1, 260, 300, 310}}
		type alone struct{ last, step []float32 }
		want := make([]alone, len(prompts))
		for i, p := range prompts {
			rows, nx := stepwise(t, m, p, next)
			want[i] = alone{rows[len(p)-1], nx}
		}
		cache := newCache(t, m, 64)
		seqs := make([]int, len(prompts))
		for i := range seqs {
			seqs[i] = newSeq(t, cache)
		}
		var b Batch
		var out Logits
		last := make([]int, len(prompts))
		for i := range last {
			last[i] = -1
		}
		for pos := 0; pos < len(prompt); pos++ {
			for i, p := range prompts {
				if pos < len(p) {
					last[i] = b.Add(p[pos], int32(pos), seqs[i], last[i], false)
				}
			}
		}
		b.Logits = nil // default: only the last slot of each sequence
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		if len(out.Slots()) != len(prompts) {
			t.Fatalf("default logits for slots %v, want the last slot of each of %d sequences", out.Slots(), len(prompts))
		}
		for i := range prompts {
			sameLogits(t, "prefill together", out.Row(last[i]), want[i].last)
			cache.CommitAll(seqs[i])
		}
		if out.Row(0) != nil {
			t.Fatal("slot 0 did not ask for logits but has a row")
		}
		b.Reset()
		for i, p := range prompts {
			b.Add(next, int32(len(p)), seqs[i], -1, true)
		}
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		for i := range prompts {
			sameLogits(t, "decode together", out.Row(i), want[i].step)
		}
	})
}

// TestForwardBadInput feeds malformed batches: each must fail with an
// error, without panicking and without touching the cache.
func TestForwardBadInput(t *testing.T) {
	m := load(t, "stories260K.bin")
	cache := newCache(t, m, 8)
	seq := newSeq(t, cache)
	other := newSeq(t, cache)
	// One committed row in seq, so roots sit at position 1.
	var b0 Batch
	var out Logits
	b0.Add(1, 0, seq, -1, true)
	if err := m.Forward(&b0, cache, &out); err != nil {
		t.Fatal(err)
	}
	cache.CommitAll(seq)

	small, err := kv.New(kv.Config{Layers: 2, KVDim: 32, Context: 8, Type: weights.F32})
	if err != nil {
		t.Fatal(err)
	}
	small.NewSeq()

	for _, tc := range []struct {
		name  string
		b     Batch
		cache *kv.Cache
		out   *Logits
		full  bool // the error wraps kv.ErrContextFull
	}{
		{name: "empty", b: Batch{}},
		{name: "short positions", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{1}, Seq: []int{seq, seq}, Parent: []int{-1, 0}}},
		{name: "short seqs", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{}, Parent: []int{-1}}},
		{name: "short parents", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}}},
		{name: "short logits flags", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{1, 2}, Seq: []int{seq, seq}, Parent: []int{-1, 0}, Logits: []bool{true}}},
		{name: "negative token", b: Batch{Tokens: []int32{-1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{-1}}},
		{name: "token past vocab", b: Batch{Tokens: []int32{512}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{-1}}},
		{name: "negative position", b: Batch{Tokens: []int32{1}, Pos: []int32{-1}, Seq: []int{seq}, Parent: []int{-1}}, full: true},
		{name: "position past model context", b: Batch{Tokens: []int32{1}, Pos: []int32{512}, Seq: []int{seq}, Parent: []int{-1}}, full: true},
		{name: "root not at committed length", b: Batch{Tokens: []int32{1}, Pos: []int32{3}, Seq: []int{seq}, Parent: []int{-1}}},
		{name: "unknown sequence", b: Batch{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int{7}, Parent: []int{-1}}},
		{name: "negative sequence", b: Batch{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int{-1}, Parent: []int{-1}}},
		{name: "parent is itself", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{0}}},
		{name: "parent later", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{2, 1}, Seq: []int{seq, seq}, Parent: []int{1, -1}}},
		{name: "parent below -1", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{-2}}},
		{name: "parent past batch", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{9}}},
		{name: "parent in other sequence", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int{other, seq}, Parent: []int{-1, 0}}},
		{name: "child position skips", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{1, 3}, Seq: []int{seq, seq}, Parent: []int{-1, 0}}},
		{name: "context full", b: Batch{Tokens: make([]int32, 8), Pos: []int32{1, 2, 3, 4, 5, 6, 7, 8}, Seq: []int{seq, seq, seq, seq, seq, seq, seq, seq}, Parent: []int{-1, 0, 1, 2, 3, 4, 5, 6}}, full: true},
		{name: "short after rows", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{1, 2}, Seq: []int{seq, seq}, Parent: []int{-1, 0}, After: []int{-1}}},
		{name: "after a row that is not there", b: Batch{Tokens: []int32{1}, Pos: []int32{2}, Seq: []int{seq}, Parent: []int{-1}, After: []int{0}}},
		{name: "after below -1", b: Batch{Tokens: []int32{1}, Pos: []int32{2}, Seq: []int{seq}, Parent: []int{-1}, After: []int{-3}}},
		{name: "both parent and after", b: Batch{Tokens: []int32{1, 2}, Pos: []int32{1, 2}, Seq: []int{seq, seq}, Parent: []int{-1, 0}, After: []int{-1, 0}}},
		{name: "nil cache", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{-1}}, cache: nil, out: &Logits{}},
		{name: "cache of another shape", b: Batch{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int{0}, Parent: []int{-1}}, cache: small},
		{name: "nil logits", b: Batch{Tokens: []int32{1}, Pos: []int32{1}, Seq: []int{seq}, Parent: []int{-1}}, out: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, o := cache, &out
			if tc.cache != nil || tc.name == "nil cache" {
				c = tc.cache
			}
			if tc.name == "nil logits" {
				o = tc.out
			}
			err := m.Forward(&tc.b, c, o)
			if err == nil {
				t.Fatal("Forward accepted the batch")
			}
			if tc.full != errors.Is(err, kv.ErrContextFull) {
				t.Errorf("errors.Is(err, kv.ErrContextFull) = %v, want %v: %v", !tc.full, tc.full, err)
			}
			t.Log(err)
			if cache.Len(seq) != 1 || cache.Tentative(seq) != 0 || cache.Len(other) != 0 || cache.Tentative(other) != 0 {
				t.Fatalf("failed Forward changed the cache: seq %d+%d, other %d+%d rows",
					cache.Len(seq), cache.Tentative(seq), cache.Len(other), cache.Tentative(other))
			}
		})
	}
}

// TestForwardTreeRows: a cache's tree rows hold a wide tree at the last
// positions of its context, but no position past that context.
func TestForwardTreeRows(t *testing.T) {
	m := load(t, "stories260K.bin")
	cache, err := m.NewTreeCache(4, 8, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	seq := newSeq(t, cache)
	var b Batch
	var out Logits
	b.Chain([]int32{1, 2, 3}, 0, seq, -1, false)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	cache.CommitAll(seq)
	// Six siblings at position 3: more rows than the context has left.
	b.Reset()
	for tok := range int32(6) {
		b.Add(10+tok, 3, seq, -1, true)
	}
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatalf("a tree in the tree rows: %v", err)
	}
	cache.Drop(seq)
	b.Reset()
	b.Add(10, 3, seq, -1, false)
	b.Add(11, 4, seq, 0, true)
	err = m.Forward(&b, cache, &out)
	if !errors.Is(err, kv.ErrContextFull) {
		t.Fatalf("position 4 in a cache of context 4: %v, want ErrContextFull", err)
	}
	if cache.Len(seq) != 3 || cache.Tentative(seq) != 0 {
		t.Fatalf("failed Forward changed the cache: %d+%d rows", cache.Len(seq), cache.Tentative(seq))
	}
}

// TestAttentionCutsHeadsForItsWorkers: attention splits a group of query
// heads only for the workers the pool gives it, not for the pool's
// threads: on one worker an eight-thread model keeps stories260K's pairs
// of heads whole (half the kernel calls), on eight it cuts them.
func TestAttentionCutsHeadsForItsWorkers(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := loadThreads(t, f, 8)
	c := m.Config()
	j := attendJob{m: m, n: 1, maxLen: 16}
	if j.Units(1); j.heads != c.Heads/c.KVHeads {
		t.Errorf("one worker: %d query heads a task, want the group of %d", j.heads, c.Heads/c.KVHeads)
	}
	if j.Units(8); j.heads != 1 {
		t.Errorf("eight workers: %d query heads a task, want 1", j.heads)
	}
}

// TestThreadsKeepLogits: the thread count changes how work is split, not
// the arithmetic. With eight threads one token's attention has fewer
// groups of query heads sharing a KV head (stories260K: four of two) than
// twice the workers, so the groups are split into single heads whenever
// the pool gives it more than one. The pool times every worker count for
// each size of job before it settles, and attention past 64 positions is
// large enough to be split at all, so 160 positions run each count on
// each size from 64 to 160; the logits must stay those of one thread,
// bit for bit, on every backend.
func TestThreadsKeepLogits(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	models := map[int]*Model{}
	for _, threads := range []int{1, 8} {
		m, err := Load(f, Options{Threads: threads})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		models[threads] = m
	}
	if c := models[1].Config(); c.Heads/c.KVHeads < 2 {
		t.Fatalf("setup: %d heads on %d KV heads share none", c.Heads, c.KVHeads)
	}
	prompt := []int32{1}
	for len(prompt) < 160 {
		prompt = append(prompt, 403, 407, 261, 378, 275, 266, 405, 29, 400, 395, 279)
	}
	backends(t, func(t *testing.T) {
		steps1, next1 := stepwise(t, models[1], prompt, 300)
		steps8, next8 := stepwise(t, models[8], prompt, 300)
		for i := range steps1 {
			sameLogits(t, fmt.Sprintf("position %d, 8 threads", i), steps8[i], steps1[i])
		}
		sameLogits(t, "next token, 8 threads", next8, next1)
	})
}
