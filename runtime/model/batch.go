package model

import (
	"fmt"

	"github.com/tandem-llm/tandem/runtime/kv"
)

// Batch is a set of token slots evaluated in one pass.
//
// A slot attends to its sequence's committed KV rows, then to its
// ancestors in the batch (following Parent) and itself. So a prefill is a
// chain (slot i's parent is i-1), several sequences decode together as one
// root slot each, and a draft tree or a tree under verification is a set
// of slots whose parents form the tree.
//
// A tree may also grow over several calls: a slot with no parent in the
// batch can hang under a tentative row an earlier call left in the cache
// (After), and then attends to that row and its tentative ancestors too.
// That is how the draft extends any branch of its token tree for the
// price of the new tokens alone.
type Batch struct {
	Tokens []int32 // token id per slot
	Pos    []int32 // absolute position per slot (RoPE): a root's is its sequence's committed length (plus 1 + the depth of its After row), a child's its parent's + 1
	Seq    []int   // which sequence's KV cache the slot reads and writes
	Parent []int   // tree parent slot within this batch (an earlier slot of the same sequence), -1 = none in this batch
	Logits []bool  // whether to produce logits for the slot (nil = only the last slot of each sequence)
	// After is, for a slot whose Parent is -1, the tentative row of its
	// sequence (kv.Cache tentative index, from an earlier call) it
	// follows; -1 follows the committed rows. Empty means -1 for all.
	After []int
}

// Len is the number of slots.
func (b *Batch) Len() int { return len(b.Tokens) }

// Reset empties the batch, keeping its memory.
func (b *Batch) Reset() {
	b.Tokens, b.Pos, b.Seq, b.Parent, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Parent[:0], b.Logits[:0]
	b.After = b.After[:0]
}

// Add appends a slot and returns its index. Batches built only with Add
// always carry explicit Logits flags.
func (b *Batch) Add(token, pos int32, seq, parent int, logits bool) int {
	if len(b.Logits) != len(b.Tokens) {
		// A batch filled by hand with nil Logits: make the default
		// explicit before appending.
		b.Logits = b.defaultLogits(b.Logits[:0])
	}
	if len(b.After) > 0 && len(b.After) == len(b.Tokens) {
		b.After = append(b.After, -1)
	}
	b.Tokens = append(b.Tokens, token)
	b.Pos = append(b.Pos, pos)
	b.Seq = append(b.Seq, seq)
	b.Parent = append(b.Parent, parent)
	b.Logits = append(b.Logits, logits)
	return len(b.Tokens) - 1
}

// AddAfter appends a slot that follows tentative row after of its
// sequence, left by an earlier Forward (see Batch.After), and returns its
// index. pos must be one past that row's position.
func (b *Batch) AddAfter(token, pos int32, seq, after int, logits bool) int {
	i := b.Add(token, pos, seq, -1, logits)
	for len(b.After) < len(b.Tokens) {
		b.After = append(b.After, -1)
	}
	b.After[i] = after
	return i
}

// after is slot i's After row (-1 when the batch has none).
func (b *Batch) after(i int) int {
	if len(b.After) == 0 {
		return -1
	}
	return b.After[i]
}

// Chain appends tokens as a chain continuing sequence seq at position
// pos: the first slot is a root (or continues slot parent when parent >=
// 0), each next slot the child of the one before. Only the last slot asks
// for logits when last is true. It returns the index of the last slot.
func (b *Batch) Chain(tokens []int32, pos int32, seq, parent int, last bool) int {
	for i, t := range tokens {
		parent = b.Add(t, pos+int32(i), seq, parent, last && i == len(tokens)-1)
	}
	return parent
}

// defaultLogits appends the nil-Logits rule to dst: only the last slot of
// each sequence.
func (b *Batch) defaultLogits(dst []bool) []bool {
	dst = append(dst[:0], make([]bool, len(b.Tokens))...)
	lastOf := map[int]int{}
	for i, s := range b.Seq {
		lastOf[s] = i
	}
	for _, i := range lastOf {
		dst[i] = true
	}
	return dst
}

// validate checks the batch against the model and the cache before
// Forward changes anything, so a bad batch leaves the cache as it was.
func (m *Model) validate(b *Batch, cache *kv.Cache) error {
	n := len(b.Tokens)
	if n == 0 {
		return fmt.Errorf("model: forward: empty batch")
	}
	if len(b.Pos) != n || len(b.Seq) != n || len(b.Parent) != n || (b.Logits != nil && len(b.Logits) != n) || (len(b.After) != 0 && len(b.After) != n) {
		return fmt.Errorf("model: forward: batch slices differ in length: %d tokens, %d positions, %d seqs, %d parents, %d logits flags, %d after rows (nil flags and after rows are allowed)",
			n, len(b.Pos), len(b.Seq), len(b.Parent), len(b.Logits), len(b.After))
	}
	if cache == nil {
		return fmt.Errorf("model: forward: nil KV cache")
	}
	cc := cache.Config()
	if cc.Layers != m.cfg.Layers || cc.KVDim != m.cfg.KVDim() {
		return fmt.Errorf("model: forward: KV cache has %d layers of width %d, the model needs %d of width %d; make it with Model.NewCache",
			cc.Layers, cc.KVDim, m.cfg.Layers, m.cfg.KVDim())
	}
	for i := 0; i < n; i++ {
		tok, pos, seq, par := b.Tokens[i], b.Pos[i], b.Seq[i], b.Parent[i]
		if tok < 0 || int(tok) >= m.cfg.Vocab {
			return fmt.Errorf("model: forward: slot %d: token %d is outside the vocabulary of %d", i, tok, m.cfg.Vocab)
		}
		if pos < 0 || int(pos) >= m.cfg.Context {
			return fmt.Errorf("model: forward: slot %d: position %d is outside the model's context of %d: %w", i, pos, m.cfg.Context, kv.ErrContextFull)
		}
		if int(pos) >= cc.Context {
			return fmt.Errorf("model: forward: slot %d: position %d is outside the cache's context of %d: %w", i, pos, cc.Context, kv.ErrContextFull)
		}
		if !cache.Valid(seq) {
			return fmt.Errorf("model: forward: slot %d: sequence %d: %w", i, seq, kv.ErrUnknownSeq)
		}
		after := b.after(i)
		switch {
		case par == -1 && after != -1:
			if after < 0 || after >= cache.Tentative(seq) {
				return fmt.Errorf("model: forward: slot %d: after row %d is not one of sequence %d's %d tentative rows", i, after, seq, cache.Tentative(seq))
			}
			if want := cache.Len(seq) + cache.Depth(seq, after) + 1; int(pos) != want {
				return fmt.Errorf("model: forward: slot %d: position %d, but it follows tentative row %d at %d; a child is one past its parent", i, pos, after, want-1)
			}
		case par == -1:
			if int(pos) != cache.Len(seq) {
				return fmt.Errorf("model: forward: slot %d: root slot has position %d but sequence %d has %d committed rows; a root continues the committed tokens", i, pos, seq, cache.Len(seq))
			}
		case after != -1:
			return fmt.Errorf("model: forward: slot %d: has both a parent slot (%d) and an after row (%d); a slot follows one or the other", i, par, after)
		case par < -1 || par >= i:
			return fmt.Errorf("model: forward: slot %d: parent %d must be -1 or an earlier slot (0..%d)", i, par, i-1)
		case b.Seq[par] != seq:
			return fmt.Errorf("model: forward: slot %d: parent slot %d belongs to sequence %d, not %d", i, par, b.Seq[par], seq)
		case pos != b.Pos[par]+1:
			return fmt.Errorf("model: forward: slot %d: position %d, but its parent slot %d is at %d; a child is one past its parent", i, pos, par, b.Pos[par])
		}
	}
	// Room in each sequence for one tentative row per slot.
	count := map[int]int{}
	for _, s := range b.Seq {
		count[s]++
	}
	for s, c := range count {
		if room := cache.Room(s); c > room {
			return fmt.Errorf("model: forward: sequence %d needs %d rows, %d are left (%d committed, %d tentative, %d rows): %w",
				s, c, room, cache.Len(s), cache.Tentative(s), cc.SeqRows(), kv.ErrContextFull)
		}
	}
	return nil
}
