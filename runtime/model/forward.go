package model

import (
	"fmt"
	"slices"

	"github.com/tandem-llm/tandem/runtime/kv"
)

// buffers are the activations of one Forward, grown to the largest batch
// seen and reused, so decoding allocates nothing per token.
type buffers struct {
	x, xb, q, k, v, att, tmp, hb, hb2, xs []float32
	scores                                []float32
	cos, sin                              []float32 // each slot's RoPE angles, for every layer

	row    []byte  // one embedding row read from a streamed file
	rows   []int32 // cache row each slot writes
	prefix []int   // committed rows each slot reads
	anc    []int32 // ancestor rows (root first, the slot's own row last), flat
	ancLo  []int   // slot i's ancestors are anc[ancLo[i]:ancHi[i]]
	ancHi  []int
	want   []bool

	count, had map[int]int   // Forward's slots and prior tentative rows per sequence
	next       map[int]int32 // Forward's next row per sequence
}

func (bf *buffers) grow(n int, c Config) {
	kvd := c.KVDim()
	bf.x = grow(bf.x, n*c.Dim)
	bf.xb = grow(bf.xb, n*c.Dim)
	bf.q = grow(bf.q, n*c.Dim)
	bf.att = grow(bf.att, n*c.Dim)
	bf.tmp = grow(bf.tmp, n*c.Dim)
	bf.k = grow(bf.k, n*kvd)
	bf.v = grow(bf.v, n*kvd)
	bf.hb = grow(bf.hb, n*c.Hidden)
	bf.hb2 = grow(bf.hb2, n*c.Hidden)
	bf.cos = grow(bf.cos, n*c.HeadDim/2)
	bf.sin = grow(bf.sin, n*c.HeadDim/2)
}

// Forward evaluates a batch. Used by every decode mode:
//
//   - Every slot's K and V go to a new tentative row of its sequence,
//     appended in batch order after the rows already there: the k-th slot
//     of sequence s in this batch is tentative row Tentative(s)+k as it
//     was before the call. They stay until the caller keeps a path
//     (kv.Cache.Commit, CommitAll), drops them or truncates.
//   - A slot attends to its sequence's committed rows, then to its
//     ancestors in this batch and itself; a slot hung under a tentative
//     row of an earlier call (Batch.After) attends to that row and its
//     tentative ancestors first. Other tentative rows are not attended to.
//   - The cache records each new row's parent (kv.Cache.Link), so the
//     rows of a tree can be committed by path later.
//   - out receives logits for the slots that asked (Batch.Logits).
//
// A batch that fails validation changes nothing. If computing fails
// after rows were reserved (a streamed read, say), this call's rows are
// dropped and the cache is as it was before the call.
func (m *Model) Forward(b *Batch, cache *kv.Cache, out *Logits) error {
	if out == nil {
		return fmt.Errorf("model: forward: nil Logits")
	}
	if err := m.validate(b, cache); err != nil {
		return err
	}
	bf := &m.buf

	// Rows: validation checked the room, so Reserve cannot fail here.
	// The maps are the model's, cleared per call: a decode step then
	// allocates nothing.
	count, next, had := bf.count, bf.next, bf.had // had: tentative rows before this call
	if count == nil {
		count, next, had = map[int]int{}, map[int]int32{}, map[int]int{}
		bf.count, bf.next, bf.had = count, next, had
	}
	clear(count)
	clear(next)
	clear(had)
	for _, s := range b.Seq {
		count[s]++
	}
	undo := func() {
		for s, n := range had {
			cache.DropAfter(s, n)
		}
	}
	for s, c := range count {
		had[s] = cache.Tentative(s)
		first, err := cache.Reserve(s, c)
		if err != nil {
			undo()
			return fmt.Errorf("model: forward: %w", err)
		}
		next[s] = int32(first)
	}
	bf.rows = bf.rows[:0]
	bf.prefix = bf.prefix[:0]
	for i, s := range b.Seq {
		bf.rows = append(bf.rows, next[s])
		bf.prefix = append(bf.prefix, cache.Len(s))
		next[s]++
		parent := b.after(i)
		if p := b.Parent[i]; p >= 0 {
			parent = int(bf.rows[p]) - cache.Len(s)
		}
		// Validation checked the parents, so Link cannot fail here.
		cache.Link(s, int(bf.rows[i])-cache.Len(s), parent)
	}
	m.ancestors(b, cache)

	if m.lane != nil {
		m.lane.Lock()
		defer m.lane.Unlock()
	}
	if err := m.forward(b, cache, out); err != nil {
		undo()
		return err
	}
	return nil
}

// ancestors lists, for each slot, the tentative rows it attends to: its
// ancestors root first, then itself. A chain shares one run of anc (each
// slot's list extends its parent's in place), so a long prefill costs
// O(n) here, not O(n²). A slot hung under an earlier call's row starts
// with that row's tentative ancestors, read from the cache's links.
func (m *Model) ancestors(b *Batch, cache *kv.Cache) {
	bf := &m.buf
	bf.anc, bf.ancLo, bf.ancHi = bf.anc[:0], bf.ancLo[:0], bf.ancHi[:0]
	for i, p := range b.Parent {
		var lo int
		switch {
		case p < 0:
			lo = len(bf.anc)
			seq := b.Seq[i]
			base := int32(cache.Len(seq))
			for r := b.after(i); r >= 0; r = cache.Parent(seq, r) {
				bf.anc = append(bf.anc, base+int32(r))
			}
			slices.Reverse(bf.anc[lo:])
		case bf.ancHi[p] == len(bf.anc):
			lo = bf.ancLo[p]
		default:
			lo = len(bf.anc)
			bf.anc = append(bf.anc, bf.anc[bf.ancLo[p]:bf.ancHi[p]]...)
		}
		bf.anc = append(bf.anc, bf.rows[i])
		bf.ancLo = append(bf.ancLo, lo)
		bf.ancHi = append(bf.ancHi, len(bf.anc))
	}
}

func (m *Model) forward(b *Batch, cache *kv.Cache, out *Logits) error {
	if err := m.ops.begin(b, cache); err != nil {
		return err
	}
	return m.ops.end(m.pass(b, cache, out))
}

// pass is the recipe of one Forward: embeddings, the layers, the head.
func (m *Model) pass(b *Batch, cache *kv.Cache, out *Logits) error {
	o := m.ops
	if err := o.embed(b.Tokens); err != nil {
		return err
	}
	for li := range m.layers {
		L, release, err := m.acquireLayer(li)
		if err != nil {
			return err
		}
		err = o.useLayer(li, L)
		if err == nil {
			err = m.block(b, cache, li, L)
		}
		release()
		if err != nil {
			return err
		}
	}
	return m.head(b, out)
}

// block runs one transformer layer over the batch's activations: the one
// recipe every backend computes (see ops).
func (m *Model) block(b *Batch, cache *kv.Cache, li int, L *layer) error {
	o := m.ops
	o.rmsNorm(actXB, actX, L.attnNorm)
	if err := o.matmul(actQ, &L.wq, actXB); err != nil {
		return err
	}
	if err := o.matmul(actK, &L.wk, actXB); err != nil {
		return err
	}
	if err := o.matmul(actV, &L.wv, actXB); err != nil {
		return err
	}
	o.rope(b.Pos)
	o.storeKV(b, cache, li)
	o.attention(b, cache, li)
	if err := o.matmul(actTmp, &L.wo, actAtt); err != nil {
		return err
	}
	o.add(actX, actTmp)

	o.rmsNorm(actXB, actX, L.ffnNorm)
	if err := o.matmul(actHB, &L.gate, actXB); err != nil {
		return err
	}
	if err := o.matmul(actHB2, &L.up, actXB); err != nil {
		return err
	}
	o.siluMul(actHB, actHB2)
	if err := o.matmul(actTmp, &L.down, actHB); err != nil {
		return err
	}
	o.add(actX, actTmp)
	return nil
}

// head computes logits for the slots that want them. A streamed head is
// acquired even when no slot does, so every pass reads the groups in the
// one order the streamer prefetches.
func (m *Model) head(b *Batch, out *Logits) error {
	bf := &m.buf
	output, release, err := m.acquireHead()
	if err != nil {
		return err
	}
	defer release()
	want := b.Logits
	if want == nil {
		bf.want = b.defaultLogits(bf.want)
		want = bf.want
	}
	if rows := out.reset(m.cfg.Vocab, want); rows == 0 {
		return nil
	}
	return m.ops.logits(out, output)
}

// embedRow returns token tok's embedding row: a view of the file, of a
// pinned group, or read from the file into a scratch row when streaming.
func (m *Model) embedRow(tok int32, rowBytes uint64) ([]byte, error) {
	off := uint64(tok) * rowBytes
	if m.stream == nil {
		return m.embd.data[off : off+rowBytes], nil
	}
	if views, ok := m.stream.Pinned(m.embGroup); ok {
		return views[m.embIndex][off : off+rowBytes], nil
	}
	m.buf.row = grow(m.buf.row, int(rowBytes))
	if err := m.stream.ReadTensorAt(m.embd.name, m.buf.row, off); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return m.buf.row, nil
}

// acquireLayer returns layer li with its matrices readable until release.
func (m *Model) acquireLayer(li int) (*layer, func(), error) {
	L := &m.layers[li]
	if m.stream == nil {
		return L, func() {}, nil
	}
	views, err := m.acquire(li)
	if err != nil {
		return nil, nil, fmt.Errorf("model: layer %d: %w", li, err)
	}
	for i, w := range []*matrix{&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.down, &L.up} {
		w.data = views[i]
	}
	return L, func() {
		for _, w := range []*matrix{&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.down, &L.up} {
			w.data = nil // the bytes belong to the streamer now
		}
		m.stream.Release(li)
	}, nil
}

// acquire waits for a streamed group, letting go of the lane meanwhile.
func (m *Model) acquire(g int) ([][]byte, error) {
	if m.lane != nil && !m.stream.Ready(g) {
		m.lane.Unlock()
		defer m.lane.Lock()
	}
	return m.stream.Acquire(g)
}

// acquireHead returns the output matrix, readable until release.
func (m *Model) acquireHead() (*matrix, func(), error) {
	if m.stream == nil {
		return &m.output, func() {}, nil
	}
	g := m.cfg.Layers
	views, err := m.acquire(g)
	if err != nil {
		return nil, nil, fmt.Errorf("model: output head: %w", err)
	}
	w := m.output
	w.data = views[0]
	return &w, func() { m.stream.Release(g) }, nil
}
