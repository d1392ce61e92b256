package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// buffers are the activations of one Forward, grown to the largest batch
// seen and reused, so decoding allocates nothing per token.
type buffers struct {
	x, xb, q, k, v, att, tmp, hb, hb2, xs []float32
	scores                                []float32

	row    []byte  // one embedding row read from a streamed file
	rows   []int32 // cache row each slot writes
	prefix []int   // committed rows each slot reads
	anc    []int32 // ancestor rows (root first, the slot's own row last), flat
	ancLo  []int   // slot i's ancestors are anc[ancLo[i]:ancHi[i]]
	ancHi  []int
	want   []bool
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
	cfg := m.cfg
	n := len(b.Tokens)
	bf := &m.buf
	bf.grow(n, cfg)

	// Rows: validation checked the room, so Reserve cannot fail here.
	count := map[int]int{}
	for _, s := range b.Seq {
		count[s]++
	}
	next := make(map[int]int32, len(count))
	had := make(map[int]int, len(count)) // tentative rows before this call
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
	cfg := m.cfg
	bf := &m.buf
	dim := cfg.Dim

	embRow, err := m.embd.typ.RowBytes(uint64(dim))
	if err != nil {
		return fmt.Errorf("model: %s: %w", m.embd.name, err)
	}
	for i, tok := range b.Tokens {
		src, err := m.embedRow(tok, embRow)
		if err != nil {
			return err
		}
		if err := weights.Dequantize(m.embd.typ, src, bf.x[i*dim:(i+1)*dim]); err != nil {
			return fmt.Errorf("model: %s row %d: %w", m.embd.name, tok, err)
		}
	}

	for li := range m.layers {
		L, release, err := m.acquireLayer(li)
		if err != nil {
			return err
		}
		err = m.block(b, cache, li, L)
		release()
		if err != nil {
			return err
		}
	}
	return m.head(b, out)
}

// block runs one transformer layer over the batch's activations.
func (m *Model) block(b *Batch, cache *kv.Cache, li int, L *layer) error {
	cfg := m.cfg
	n := len(b.Tokens)
	bf := &m.buf
	dim, kvd, hid := cfg.Dim, cfg.KVDim(), cfg.Hidden
	for i := 0; i < n; i++ {
		kernels.RMSNorm(bf.xb[i*dim:(i+1)*dim], bf.x[i*dim:(i+1)*dim], L.attnNorm, cfg.Eps)
	}
	if err := m.matmul(bf.q, &L.wq, bf.xb, n); err != nil {
		return err
	}
	if err := m.matmul(bf.k, &L.wk, bf.xb, n); err != nil {
		return err
	}
	if err := m.matmul(bf.v, &L.wv, bf.xb, n); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		pos := int(b.Pos[i])
		kernels.RoPE(bf.q[i*dim:(i+1)*dim], cfg.Heads, cfg.HeadDim, pos, cfg.RopeTheta)
		kernels.RoPE(bf.k[i*kvd:(i+1)*kvd], cfg.KVHeads, cfg.HeadDim, pos, cfg.RopeTheta)
		cache.Put(b.Seq[i], li, int(bf.rows[i]), bf.k[i*kvd:(i+1)*kvd], bf.v[i*kvd:(i+1)*kvd])
	}
	m.attention(b, cache, li)
	if err := m.matmul(bf.tmp, &L.wo, bf.att, n); err != nil {
		return err
	}
	kernels.Add(bf.x[:n*dim], bf.tmp[:n*dim])

	for i := 0; i < n; i++ {
		kernels.RMSNorm(bf.xb[i*dim:(i+1)*dim], bf.x[i*dim:(i+1)*dim], L.ffnNorm, cfg.Eps)
	}
	if err := m.matmul(bf.hb, &L.gate, bf.xb, n); err != nil {
		return err
	}
	if err := m.matmul(bf.hb2, &L.up, bf.xb, n); err != nil {
		return err
	}
	kernels.SiLUMul(bf.hb[:n*hid], bf.hb2[:n*hid])
	if err := m.matmul(bf.tmp, &L.down, bf.hb, n); err != nil {
		return err
	}
	kernels.Add(bf.x[:n*dim], bf.tmp[:n*dim])
	return nil
}

// head computes logits for the slots that want them. A streamed head is
// acquired even when no slot does, so every pass reads the groups in the
// one order the streamer prefetches.
func (m *Model) head(b *Batch, out *Logits) error {
	cfg := m.cfg
	bf := &m.buf
	dim := cfg.Dim
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
	rows := out.reset(cfg.Vocab, want)
	if rows == 0 {
		return nil
	}
	bf.xs = grow(bf.xs, rows*dim)
	for j, i := range out.slots {
		kernels.RMSNorm(bf.xs[j*dim:(j+1)*dim], bf.x[i*dim:(i+1)*dim], m.outNorm, cfg.Eps)
	}
	return m.matmul(out.data, output, bf.xs, rows)
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
	m.buf.row = growBytes(m.buf.row, int(rowBytes))
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

// matmul computes out = W·x for n input columns, reading W once.
func (m *Model) matmul(out []float32, w *matrix, x []float32, n int) error {
	if err := m.pool.MatMul(out[:n*w.rows], w.data, w.typ, w.rows, w.cols, x[:n*w.cols], n); err != nil {
		return fmt.Errorf("model: %s: %w", w.name, err)
	}
	return nil
}

// attention runs every (slot, head) pair of one layer on the pool. Query
// head h reads KV head h/(Heads/KVHeads) (grouped-query attention).
func (m *Model) attention(b *Batch, cache *kv.Cache, layer int) {
	cfg := m.cfg
	bf := &m.buf
	n := len(b.Tokens)
	dim, kvd, hd := cfg.Dim, cfg.KVDim(), cfg.HeadDim
	group := cfg.Heads / cfg.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))

	maxLen := 0
	for i := 0; i < n; i++ {
		maxLen = max(maxLen, bf.prefix[i]+bf.ancHi[i]-bf.ancLo[i])
	}
	tasks := n * cfg.Heads
	// Each chunk owns one scores buffer; a few chunks per thread balance
	// slots whose attention spans differ.
	chunks := min(tasks, 4*max(1, m.pool.Threads()))
	bf.scores = grow(bf.scores, chunks*maxLen)
	f16 := cache.Config().Type == weights.F16

	m.pool.Run(chunks, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			sc := bf.scores[c*maxLen : (c+1)*maxLen]
			for t := c * tasks / chunks; t < (c+1)*tasks/chunks; t++ {
				i, h := t/cfg.Heads, t%cfg.Heads
				seq := b.Seq[i]
				off := (h / group) * hd
				q := bf.q[i*dim+h*hd : i*dim+(h+1)*hd]
				o := bf.att[i*dim+h*hd : i*dim+(h+1)*hd]
				extra := bf.anc[bf.ancLo[i]:bf.ancHi[i]]
				if f16 {
					kernels.AttentionF16(o, q, cache.K16(seq, layer), cache.V16(seq, layer), kvd, off, bf.prefix[i], extra, scale, sc)
				} else {
					kernels.Attention(o, q, cache.K(seq, layer), cache.V(seq, layer), kvd, off, bf.prefix[i], extra, scale, sc)
				}
			}
		}
	})
}
