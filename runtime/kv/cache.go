// Package kv holds the attention key/value cache of every sequence a model
// is decoding.
//
// Each sequence owns rows 0..Context+Tree-1 of K and V per layer. Rows
// 0..Len-1 are committed: they belong to tokens the sequence has accepted.
// Rows after them are tentative: model.Forward appends one per batch slot
// and they stay until the caller keeps a path of them (Commit), drops them
// (Drop) or rolls the sequence back (Truncate). Tentative rows form a tree:
// each knows its parent row (or the committed tip), so a draft can grow a
// token tree over many Forward calls without evaluating a shared prefix
// twice. This is what lets one forward call serve prefill, decode, draft
// trees and tree verification: the verifier writes a whole tree
// tentatively and commits only the accepted path.
//
// A Cache is not safe for concurrent use; the engine drives it from the
// goroutine that calls Forward.
package kv

import (
	"errors"
	"fmt"

	"github.com/tandem-llm/tandem/weights"
)

// ErrContextFull is returned (wrapped with the numbers) when a sequence has
// no room for more rows. Callers test it with errors.Is and stop decoding.
var ErrContextFull = errors.New("kv: context full")

// ErrUnknownSeq is returned (wrapped) for a sequence id that was never
// allocated or has been freed.
var ErrUnknownSeq = errors.New("kv: unknown sequence")

// Config sizes a cache.
type Config struct {
	Layers  int
	KVDim   int // KV heads × head dimension
	Context int // positions per sequence: committed rows never pass it
	// Tree is how many rows a sequence has past Context for tentative
	// rows: a token tree holds many rows at few positions (128 drafted
	// tokens may reach only 10 deep), so without them a tree near the
	// end of the context, or a draft with a short context, would be cut.
	Tree int
	// Type is weights.F32 or weights.F16. F16 halves the memory and
	// costs a rounding of K and V to half precision.
	Type weights.DType
	// MaxSeqs bounds the live sequences (0: no bound), so that a server
	// cannot allocate past its memory plan.
	MaxSeqs int
	// Rows, when set, holds the rows instead of host memory (a GPU's
	// memory: runtime/model makes such caches for models that compute
	// there). Put, K, V, K16 and V16 are then unused and return nil.
	Rows Rows
}

// Rows keeps a cache's K and V rows outside host memory. The Cache keeps
// the bookkeeping (committed and tentative rows, the tentative tree) and
// calls Rows to allocate a sequence's rows and to compact them on Commit;
// the model that computes with the cache writes and reads them.
type Rows interface {
	// Alloc makes room for Context rows of every layer of sequence id
	// (called by NewSeq, for new and reused ids).
	Alloc(id int) error
	// Free releases sequence id's rows (called by Free).
	Free(id int)
	// Move copies row src[i] to row dst[i] (absolute row indices) in
	// every layer of sequence id, for i in order: a later copy reads what
	// an earlier one wrote. Called by Commit and CommitKeep.
	Move(id int, dst, src []int) error
}

// RowCopier is a Rows that can copy rows between sequences, for
// CopyPrefix. Rows without it leave CopyPrefix unsupported.
type RowCopier interface {
	// CopyRows copies rows 0..n-1 of every layer of sequence src to the
	// same rows of sequence dst.
	CopyRows(dst, src, n int) error
}

// RowReleaser is a Rows that keeps freed sequences' rows for the next
// Alloc and can give that memory back, for Release.
type RowReleaser interface {
	// Release frees the rows of sequences already freed.
	Release() error
}

// SeqRows is the rows one sequence holds, committed and tentative: Context +
// Tree.
func (c Config) SeqRows() int { return c.Context + c.Tree }

// SeqBytes is the memory one sequence takes: SeqRows × Layers × KVDim for K
// and again for V.
func (c Config) SeqBytes() int64 {
	return int64(c.SeqRows()) * int64(c.Layers) * int64(c.KVDim) * 2 * int64(c.Type.TypeSize())
}

func (c Config) validate() error {
	if c.Layers <= 0 || c.KVDim <= 0 || c.Context <= 0 {
		return fmt.Errorf("kv: layers %d, kv dim %d and context %d must all be positive", c.Layers, c.KVDim, c.Context)
	}
	if c.Type != weights.F32 && c.Type != weights.F16 {
		return fmt.Errorf("kv: cache type %v is not supported; use F32 or F16", c.Type)
	}
	if c.MaxSeqs < 0 || c.Tree < 0 {
		return fmt.Errorf("kv: max sequences %d and tree rows %d must not be negative", c.MaxSeqs, c.Tree)
	}
	// The row index of any element must fit an int on 32-bit targets too.
	const maxElems = 1<<31 - 1
	if int64(c.SeqRows())*int64(c.Layers)*int64(c.KVDim)*2 > maxElems {
		return fmt.Errorf("kv: %d rows × layers %d × kv dim %d is too large for one sequence buffer; lower the context", c.SeqRows(), c.Layers, c.KVDim)
	}
	return nil
}

// seq is one sequence's rows. Exactly one of f32 and f16 is set.
type seq struct {
	f32       []float32
	f16       []uint16
	committed int
	tentative int
	// parent and depth describe the tentative tree: parent[i] is the
	// tentative row that row i follows (-1: the committed tip) and
	// depth[i] its distance from the tip (0 for a row that follows it).
	parent []int32
	depth  []int32
}

// Cache holds the KV rows of several sequences of one model.
type Cache struct {
	cfg    Config
	seqs   []*seq // index is the sequence id; nil once freed
	spares []*seq // buffers of freed sequences, reused by NewSeq
	live   int
}

// New makes an empty cache. Memory is allocated per sequence by NewSeq.
func New(cfg Config) (*Cache, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Cache{cfg: cfg}, nil
}

// Config returns the configuration the cache was made with.
func (c *Cache) Config() Config { return c.cfg }

// ---- cache management (used by the decode loops and the scheduler) ----

// NewSeq allocates a sequence with no rows and returns its id. Ids of freed
// sequences are reused.
func (c *Cache) NewSeq() (int, error) {
	if c.cfg.MaxSeqs > 0 && c.live >= c.cfg.MaxSeqs {
		return 0, fmt.Errorf("kv: all %d sequences are in use; free one or raise MaxSeqs", c.cfg.MaxSeqs)
	}
	var s *seq
	if n := len(c.spares); n > 0 {
		s, c.spares = c.spares[n-1], c.spares[:n-1]
		s.committed, s.tentative = 0, 0
		s.parent, s.depth = s.parent[:0], s.depth[:0]
	} else {
		s = &seq{}
		elems := c.cfg.SeqRows() * c.cfg.Layers * c.cfg.KVDim * 2
		switch {
		case c.cfg.Rows != nil:
		case c.cfg.Type == weights.F16:
			s.f16 = make([]uint16, elems)
		default:
			s.f32 = make([]float32, elems)
		}
	}
	id := len(c.seqs)
	for i, old := range c.seqs {
		if old == nil {
			id = i
			break
		}
	}
	if c.cfg.Rows != nil {
		if err := c.cfg.Rows.Alloc(id); err != nil {
			c.spares = append(c.spares, s)
			return 0, fmt.Errorf("kv: new sequence %d: %w", id, err)
		}
	}
	c.live++
	if id == len(c.seqs) {
		c.seqs = append(c.seqs, s)
	} else {
		c.seqs[id] = s
	}
	return id, nil
}

// Free releases a sequence. Its buffer is kept for the next NewSeq.
func (c *Cache) Free(id int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	c.seqs[id] = nil
	c.spares = append(c.spares, s)
	if c.cfg.Rows != nil {
		c.cfg.Rows.Free(id)
	}
	c.live--
	return nil
}

// Release gives back the memory of freed sequences, which Free keeps
// for the next NewSeq (Rows too, when they implement RowReleaser): an
// app asked by the system to use less memory calls it. Host memory goes
// back to the Go runtime.
func (c *Cache) Release() error {
	clear(c.spares)
	c.spares = c.spares[:0]
	if r, ok := c.cfg.Rows.(RowReleaser); ok {
		return r.Release()
	}
	return nil
}

// Valid reports whether id names a live sequence.
func (c *Cache) Valid(id int) bool {
	_, err := c.get(id)
	return err == nil
}

// Len is the number of committed rows of a sequence (0 for an unknown id):
// the position the next accepted token will take.
func (c *Cache) Len(id int) int {
	if s, err := c.get(id); err == nil {
		return s.committed
	}
	return 0
}

// Tentative is the number of tentative rows after the committed ones.
func (c *Cache) Tentative(id int) int {
	if s, err := c.get(id); err == nil {
		return s.tentative
	}
	return 0
}

// Room is how many more rows (committed or tentative) the sequence can take.
func (c *Cache) Room(id int) int {
	if s, err := c.get(id); err == nil {
		return c.cfg.SeqRows() - s.committed - s.tentative
	}
	return 0
}

// Commit keeps the listed tentative rows, in order, as the next committed
// rows and drops every other tentative row. rows index the tentative rows
// (0 is the first row after the committed ones) and must be a path down
// the tentative tree from the committed tip: rows[0] follows the tip and
// each next row follows the one before (so they increase, and are
// compacted into place front to back).
func (c *Cache) Commit(id int, rows []int) error {
	_, err := c.commit(id, rows, -1, false)
	return err
}

// CommitKeep is Commit that also keeps the subtree of tentative rows
// rooted at row keep, which must follow the last row of the path (the
// branch a draft grew past what was verified, under the token the target
// chose next); -1 keeps nothing. The kept rows move to follow the new
// committed tip, in order. It returns, for every tentative row before the
// call, its tentative index after it, or -1 when it was dropped or
// committed.
func (c *Cache) CommitKeep(id int, rows []int, keep int) (remap []int, err error) {
	return c.commit(id, rows, keep, true)
}

func (c *Cache) commit(id int, rows []int, keepRow int, keep bool) ([]int, error) {
	s, err := c.get(id)
	if err != nil {
		return nil, err
	}
	if s.committed+len(rows) > c.cfg.Context {
		return nil, fmt.Errorf("kv: commit sequence %d: %d rows after %d pass the context of %d: %w", id, len(rows), s.committed, c.cfg.Context, ErrContextFull)
	}
	for i, r := range rows {
		if r < 0 || r >= s.tentative {
			return nil, fmt.Errorf("kv: commit sequence %d: row %d (entry %d) is outside the %d tentative rows", id, r, i, s.tentative)
		}
		want := int32(-1)
		if i > 0 {
			want = int32(rows[i-1])
		}
		if s.parent[r] != want {
			return nil, fmt.Errorf("kv: commit sequence %d: row %d (entry %d) follows row %d, not %d: rows must be a path down from the committed tip", id, r, i, s.parent[r], want)
		}
	}
	var remap []int
	if keep {
		tip := -1
		if len(rows) > 0 {
			tip = rows[len(rows)-1]
		}
		if keepRow != -1 && (keepRow < 0 || keepRow >= s.tentative || int(s.parent[keepRow]) != tip) {
			return nil, fmt.Errorf("kv: commit sequence %d: row %d to keep does not follow the path's last row %d", id, keepRow, tip)
		}
		// Rows are in topological order, so one pass finds the subtree.
		remap = make([]int, s.tentative)
		under := make([]bool, s.tentative)
		next := 0
		for r := 0; r < s.tentative; r++ {
			remap[r] = -1
			if p := int(s.parent[r]); r == keepRow || (p >= 0 && under[p]) {
				under[r] = true
				remap[r] = next
				next++
			}
		}
	}
	var dsts, srcs []int // the moves, for Rows
	move := func(dst, src int) {
		if dst == src {
			return
		}
		if c.cfg.Rows != nil {
			dsts, srcs = append(dsts, dst), append(srcs, src)
			return
		}
		c.copyRows(s, s, dst, src, 1)
	}
	// Destinations never pass their sources (both lists increase and a
	// row moves only down), so front-to-back copies never clobber a row
	// still to be moved.
	for i, r := range rows {
		move(s.committed+i, s.committed+r)
	}
	base := s.committed + len(rows)
	kept := 0
	for r, n := range remap {
		if n < 0 {
			continue
		}
		move(base+n, s.committed+r)
		p := int(s.parent[r])
		if p >= 0 && remap[p] >= 0 {
			s.parent[n] = int32(remap[p])
			s.depth[n] = s.depth[remap[p]] + 1
		} else {
			s.parent[n], s.depth[n] = -1, 0
		}
		kept++
	}
	if len(dsts) > 0 {
		if err := c.cfg.Rows.Move(id, dsts, srcs); err != nil {
			// Moves write only tentative rows: dropping them all leaves
			// the sequence consistent.
			s.tentative = 0
			s.parent, s.depth = s.parent[:0], s.depth[:0]
			return nil, fmt.Errorf("kv: commit sequence %d: %w", id, err)
		}
	}
	s.committed += len(rows)
	s.tentative = kept
	s.parent, s.depth = s.parent[:kept], s.depth[:kept]
	return remap, nil
}

// CommitAll keeps every tentative row, in order (prefill and plain decode,
// where the batch of a sequence is a chain).
func (c *Cache) CommitAll(id int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	s.committed += s.tentative
	s.tentative = 0
	s.parent, s.depth = s.parent[:0], s.depth[:0]
	return nil
}

// Drop discards the tentative rows of a sequence.
func (c *Cache) Drop(id int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	s.tentative = 0
	s.parent, s.depth = s.parent[:0], s.depth[:0]
	return nil
}

// DropAfter discards the tentative rows from index n on, keeping the
// first n (the rows earlier calls left, when a later one fails).
func (c *Cache) DropAfter(id, n int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	if n < 0 || n > s.tentative {
		return fmt.Errorf("kv: drop sequence %d's tentative rows after %d: it has %d", id, n, s.tentative)
	}
	s.tentative = n
	s.parent, s.depth = s.parent[:n], s.depth[:n]
	return nil
}

// Truncate rolls a sequence back to its first n committed rows and drops
// its tentative rows.
func (c *Cache) Truncate(id, n int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	if n < 0 || n > s.committed {
		return fmt.Errorf("kv: truncate sequence %d to %d rows: it has %d committed rows", id, n, s.committed)
	}
	s.committed, s.tentative = n, 0
	s.parent, s.depth = s.parent[:0], s.depth[:0]
	return nil
}

// CanCopy reports whether CopyPrefix works on this cache: always for
// host memory, for Rows only when they implement RowCopier.
func (c *Cache) CanCopy() bool {
	if c.cfg.Rows == nil {
		return true
	}
	_, ok := c.cfg.Rows.(RowCopier)
	return ok
}

// CopyPrefix makes sequence dst hold src's first n committed rows as its
// own committed rows, dropping whatever dst held: a sequence starting
// with the same n tokens as another takes their rows instead of
// evaluating them again. It fails with errors.ErrUnsupported when
// CanCopy is false. When Rows fail part way, dst keeps its bookkeeping
// but not its rows: free it.
func (c *Cache) CopyPrefix(dst, src, n int) error {
	d, err := c.get(dst)
	if err != nil {
		return err
	}
	s, err := c.get(src)
	if err != nil {
		return err
	}
	if dst == src || n < 0 || n > s.committed {
		return fmt.Errorf("kv: copy %d rows of sequence %d (%d committed) into sequence %d: want another sequence and at most its committed rows", n, src, s.committed, dst)
	}
	if c.cfg.Rows != nil {
		rc, ok := c.cfg.Rows.(RowCopier)
		if !ok {
			return fmt.Errorf("kv: copy rows between sequences: %w by these rows", errors.ErrUnsupported)
		}
		if err := rc.CopyRows(dst, src, n); err != nil {
			return fmt.Errorf("kv: copy %d rows of sequence %d into %d: %w", n, src, dst, err)
		}
	} else {
		c.copyRows(d, s, 0, 0, n)
	}
	d.committed, d.tentative = n, 0
	d.parent, d.depth = d.parent[:0], d.depth[:0]
	return nil
}

// copyRows copies rows src..src+n-1 of s to rows dst..dst+n-1 of d in
// every plane (K or V of a layer, each holding its rows contiguously);
// host memory only.
func (c *Cache) copyRows(d, s *seq, dst, src, n int) {
	kvd, plane := c.cfg.KVDim, c.cfg.SeqRows()*c.cfg.KVDim
	for p := 0; p < 2*c.cfg.Layers; p++ {
		to, from := p*plane+dst*kvd, p*plane+src*kvd
		if d.f16 != nil {
			copy(d.f16[to:to+n*kvd], s.f16[from:from+n*kvd])
		} else {
			copy(d.f32[to:to+n*kvd], s.f32[from:from+n*kvd])
		}
	}
}

// Parent is the tentative row that tentative row r of a sequence follows,
// or -1 when it follows the committed tip (or r is not a tentative row).
func (c *Cache) Parent(id, r int) int {
	if s, err := c.get(id); err == nil && r >= 0 && r < s.tentative {
		return int(s.parent[r])
	}
	return -1
}

// Depth is how far tentative row r is below the committed tip (0 when it
// follows the tip directly): its token's position is Len + Depth.
func (c *Cache) Depth(id, r int) int {
	if s, err := c.get(id); err == nil && r >= 0 && r < s.tentative {
		return int(s.depth[r])
	}
	return 0
}

// Bytes is the memory the cache holds, freed-but-kept buffers included.
func (c *Cache) Bytes() int64 {
	return int64(c.live+len(c.spares)) * c.cfg.SeqBytes()
}

// ---- used by model.Forward ----

// Reserve appends n tentative rows to a sequence and returns the absolute
// row index of the first. The rows follow the committed tip until Link
// says otherwise. It fails with ErrContextFull, changing nothing, when
// they do not fit.
func (c *Cache) Reserve(id, n int) (int, error) {
	s, err := c.get(id)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("kv: reserve %d rows in sequence %d: negative count", n, id)
	}
	if used := s.committed + s.tentative; used+n > c.cfg.SeqRows() {
		return 0, fmt.Errorf("sequence %d holds %d rows (%d committed, %d tentative), %d more exceed its %d rows: %w",
			id, used, s.committed, s.tentative, n, c.cfg.SeqRows(), ErrContextFull)
	}
	start := s.committed + s.tentative
	for i := 0; i < n; i++ {
		s.parent = append(s.parent, -1)
		s.depth = append(s.depth, 0)
	}
	s.tentative += n
	return start, nil
}

// Link records that tentative row r follows tentative row parent (-1:
// the committed tip). parent must be an earlier row, so the tree stays in
// topological order; Forward links each slot's row before it computes.
func (c *Cache) Link(id, r, parent int) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	if r < 0 || r >= s.tentative || parent < -1 || parent >= r {
		return fmt.Errorf("kv: link sequence %d: row %d cannot follow row %d (%d tentative rows; a parent comes before its child)", id, r, parent, s.tentative)
	}
	s.parent[r] = int32(parent)
	s.depth[r] = 0
	if parent >= 0 {
		s.depth[r] = s.depth[parent] + 1
	}
	return nil
}

// Put writes the key and value vectors (KVDim floats each) of one layer
// into a row previously returned by Reserve (or a committed row). F16
// caches round them to half precision here.
func (c *Cache) Put(id, layer, row int, k, v []float32) {
	s := c.seqs[id]
	kvd := c.cfg.KVDim
	kb := (2*layer*c.cfg.SeqRows() + row) * kvd
	vb := ((2*layer+1)*c.cfg.SeqRows() + row) * kvd
	if s.f16 != nil {
		kd, vd := s.f16[kb:kb+kvd], s.f16[vb:vb+kvd]
		for i := range kd {
			kd[i] = weights.F32ToF16(k[i])
			vd[i] = weights.F32ToF16(v[i])
		}
		return
	}
	copy(s.f32[kb:kb+kvd], k[:kvd])
	copy(s.f32[vb:vb+kvd], v[:kvd])
}

// K returns the keys of one layer of an F32 cache: Context rows of KVDim
// floats, row i at [i*KVDim:]. It is nil for F16 caches (use K16).
func (c *Cache) K(id, layer int) []float32 { return c.plane32(id, 2*layer) }

// V is K's twin for values.
func (c *Cache) V(id, layer int) []float32 { return c.plane32(id, 2*layer+1) }

// K16 returns the keys of one layer of an F16 cache as IEEE half bits,
// laid out as K. It is nil for F32 caches.
func (c *Cache) K16(id, layer int) []uint16 { return c.plane16(id, 2*layer) }

// V16 is K16's twin for values.
func (c *Cache) V16(id, layer int) []uint16 { return c.plane16(id, 2*layer+1) }

func (c *Cache) plane32(id, plane int) []float32 {
	s := c.seqs[id]
	if s.f32 == nil {
		return nil
	}
	n := c.cfg.SeqRows() * c.cfg.KVDim
	return s.f32[plane*n : (plane+1)*n]
}

func (c *Cache) plane16(id, plane int) []uint16 {
	s := c.seqs[id]
	if s.f16 == nil {
		return nil
	}
	n := c.cfg.SeqRows() * c.cfg.KVDim
	return s.f16[plane*n : (plane+1)*n]
}

func (c *Cache) get(id int) (*seq, error) {
	if id < 0 || id >= len(c.seqs) || c.seqs[id] == nil {
		return nil, fmt.Errorf("sequence %d: %w", id, ErrUnknownSeq)
	}
	return c.seqs[id], nil
}
