//go:build cuda

package model

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/tandem-llm/tandem/kernels/cuda"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// cudaOps computes the forward recipe on a GPU. The weights are copied to
// device memory once at Load, activations stay on the device between
// steps, and KV rows live in device memory owned by the caches that
// newCache makes (gpuRows): a commit compacts them there. Per pass, the
// host uploads the batch's small tables once and downloads only logits.
//
// A pass of at most graphSlots slots (decode, small trees) is recorded
// as a CUDA graph the first time its shape is seen and replayed after:
// its hundreds of small kernels then cost one launch. Recorded passes
// read everything that varies (tokens, positions, rows, ancestor lists,
// sequence addresses) from the uploaded tables, and their attention
// scores use a stride of the whole context, so one recording serves
// every position.
type cudaOps struct {
	m   *Model
	dev *cuda.Device
	s   *cuda.Stream

	mats  map[*byte]cuda.Buffer    // weight matrices, by their first byte in the file
	norms map[*float32]cuda.Buffer // norm vectors
	owned []cuda.Buffer            // everything to free on close
	rows  []*gpuRows               // the KV stores of caches made by newCache

	acts    [numActs]cuda.Buffer
	actCap  int // slots the activations hold
	table   cuda.Buffer
	logitsB cuda.Buffer

	// The pass: slot count, its KV store, its tables on the device.
	n                                                 int
	kv                                                *gpuRows
	stride                                            int // attention scores per (slot, head)
	tokens, pos, slotRows, prefix, anc, lo, hi, slots cuda.Buffer
	bases                                             cuda.Buffer
	host                                              []byte // the tables, packed
	want                                              []bool
	out                                               *Logits
	err                                               error

	// pending is a projection into actTmp not launched yet: the add of
	// actTmp that follows it in the recipe runs it as a MatMulAdd.
	pending    *matrix
	pendingSrc act

	mode   passMode
	key    graphKey
	graphs map[graphKey]*cuda.Graph
	gen    int // counts reallocations of the buffers graphs record
	recGen [2]int
}

// graphSlots is the largest pass recorded as a graph: launch costs
// dominate small passes, while a long prefill is bound by its work.
const graphSlots = 16

type passMode int

const (
	eager   passMode = iota // launch each step
	capture                 // launch and record
	replay                  // launch the recording at end
)

// graphKey is what a recording depends on besides the tables' contents.
type graphKey struct {
	n, logits int
	kv        *gpuRows
}

func newCUDAOps(m *Model, ordinal int) (ops, error) {
	if m.stream != nil {
		return nil, fmt.Errorf("model: device cuda:%d: streaming weights to the GPU is not supported; load the model resident (no Stream option)", ordinal)
	}
	dev, err := cuda.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	o := &cudaOps{m: m, dev: dev, mats: map[*byte]cuda.Buffer{}, norms: map[*float32]cuda.Buffer{}, graphs: map[graphKey]*cuda.Graph{}}
	if o.s, err = dev.NewStream(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := o.upload(); err != nil {
		o.close()
		return nil, err
	}
	return o, nil
}

// upload copies every matrix and norm to the device.
func (o *cudaOps) upload() error {
	m := o.m
	mats := []*matrix{&m.embd, &m.output}
	norms := [][]float32{m.outNorm}
	for i := range m.layers {
		L := &m.layers[i]
		mats = append(mats, &L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.down, &L.up)
		norms = append(norms, L.attnNorm, L.ffnNorm)
	}
	for _, w := range mats {
		if _, ok := o.mats[&w.data[0]]; ok {
			continue // the output head tied to the embedding
		}
		if !gpuType(w.typ) {
			return fmt.Errorf("model: %s: tensor %s is %s, which the GPU has no kernel for (GPU types: %v); convert the model: tandem convert --type q8_0",
				m.file.Path, w.name, w.typ, cuda.MatMulTypes)
		}
		b, err := o.alloc(int64(len(w.data)))
		if err != nil {
			return fmt.Errorf("model: %s on the GPU: %w", w.name, err)
		}
		if err := o.s.UploadWeights(b, w.data, w.typ, w.rows, w.cols); err != nil {
			return fmt.Errorf("model: %s on the GPU: %w", w.name, err)
		}
		o.mats[&w.data[0]] = b
	}
	for _, v := range norms {
		b, err := o.alloc(int64(4 * len(v)))
		if err != nil {
			return fmt.Errorf("model: norms on the GPU: %w", err)
		}
		if err := o.s.UploadFloat32(b, v); err != nil {
			return fmt.Errorf("model: norms on the GPU: %w", err)
		}
		o.norms[&v[0]] = b
	}
	return o.s.Sync()
}

func gpuType(t weights.DType) bool {
	for _, g := range cuda.MatMulTypes {
		if g == t {
			return true
		}
	}
	return false
}

func (o *cudaOps) alloc(n int64) (cuda.Buffer, error) {
	b, err := o.dev.Alloc(n)
	if err == nil {
		o.owned = append(o.owned, b)
	}
	return b, err
}

// fail keeps the first error of the pass.
func (o *cudaOps) fail(err error) {
	if err != nil && o.err == nil {
		o.err = fmt.Errorf("model: cuda: %w", err)
	}
}

func (o *cudaOps) begin(b *Batch, cache *kv.Cache) error {
	g, ok := cache.Config().Rows.(*gpuRows)
	if !ok || g.o != o {
		return fmt.Errorf("model: forward: the KV cache keeps its rows elsewhere than this model's GPU (%s); make the cache with this model's NewCache", o.dev)
	}
	if o.err != nil {
		return o.err
	}
	cfg := o.m.cfg
	bf := &o.m.buf
	n := len(b.Tokens)
	o.n, o.kv, o.mode, o.out = n, g, eager, nil
	want := b.Logits
	if want == nil {
		o.want = b.defaultLogits(o.want)
		want = o.want
	}
	var slots []int32
	for i, w := range want {
		if w {
			slots = append(slots, int32(i))
		}
	}
	graph := n <= graphSlots
	o.stride = 0
	for i := 0; i < n; i++ {
		o.stride = max(o.stride, bf.prefix[i]+bf.ancHi[i]-bf.ancLo[i])
	}
	if graph {
		o.stride = g.layout.Context
	}
	if err := o.growActs(n); err != nil {
		return err
	}
	if need := int64(len(slots)) * int64(cfg.Vocab) * 4; need > o.logitsB.Size() {
		if err := o.replace(&o.logitsB, 2*need); err != nil {
			return err
		}
	}

	// One upload of every per-slot table, 8-byte aligned; the ancestor
	// list, the one table whose length varies, goes last.
	o.host = o.host[:0]
	put := func(vals []int32) (off, size int64) {
		off = int64(len(o.host))
		o.host = append(o.host, bytesOf(vals)...)
		for len(o.host)%8 != 0 {
			o.host = append(o.host, 0)
		}
		return off, int64(4 * len(vals))
	}
	i32 := make([]int32, 0, 3*n)
	conv := func(v []int) []int32 {
		start := len(i32)
		for _, x := range v {
			i32 = append(i32, int32(x))
		}
		return i32[start:]
	}
	bases := make([]uint64, n)
	for i, s := range b.Seq {
		bases[i] = uint64(g.seqs[s].Ptr())
	}
	o.host = append(o.host, bytesOf(bases)...)
	var lay [8][2]int64
	for k, t := range [][]int32{b.Tokens, b.Pos, bf.rows, conv(bf.prefix), conv(bf.ancLo), conv(bf.ancHi), slots, bf.anc} {
		lay[k][0], lay[k][1] = put(t)
	}
	if int64(len(o.host)) > o.table.Size() {
		if err := o.replace(&o.table, int64(2*len(o.host))+4096); err != nil {
			return err
		}
	}
	if err := o.s.Upload(o.table, o.host); err != nil {
		return fmt.Errorf("model: cuda: batch tables: %w", err)
	}
	o.bases = o.table.Slice(0, int64(8*n))
	for k, p := range []*cuda.Buffer{&o.tokens, &o.pos, &o.slotRows, &o.prefix, &o.lo, &o.hi, &o.slots, &o.anc} {
		*p = o.table.Slice(lay[k][0], lay[k][1])
	}
	// Scratch for the largest matmul input and the attention scores,
	// grown now: a recording cannot grow it.
	need := max(cuda.MatMulScratch(max(n, len(slots)), max(cfg.Dim, cfg.Hidden)), cuda.AttentionScratch(n, cfg.Heads, o.stride))
	if err := o.s.Reserve(need); err != nil {
		return fmt.Errorf("model: cuda: %w", err)
	}
	if !graph {
		return nil
	}
	if gen := [2]int{o.gen, o.s.Generation()}; gen != o.recGen {
		o.dropGraphs() // buffers they recorded have moved
		o.recGen = gen
	}
	o.key = graphKey{n: n, logits: len(slots), kv: g}
	if _, ok := o.graphs[o.key]; ok {
		o.mode = replay
		return nil
	}
	if err := o.s.BeginCapture(); err != nil {
		return fmt.Errorf("model: cuda: %w", err)
	}
	o.mode = capture
	return nil
}

func (o *cudaOps) dropGraphs() {
	for k, g := range o.graphs {
		o.fail(g.Close())
		delete(o.graphs, k)
	}
}

// end launches a recorded pass and downloads the logits.
func (o *cudaOps) end(err error) error {
	if o.mode != replay {
		o.flush()
	}
	if o.mode == capture {
		g, cerr := o.s.EndCapture()
		if err == nil && cerr == nil {
			if len(o.graphs) >= 4*graphSlots {
				o.dropGraphs() // many tree shapes: start over
			}
			o.graphs[o.key] = g
		} else {
			g.Close()
			o.fail(cerr)
		}
	}
	if o.mode != eager && err == nil && o.err == nil {
		o.fail(o.s.Launch(o.graphs[o.key]))
	}
	o.mode = eager
	if err != nil {
		return err
	}
	if o.err == nil && o.out != nil {
		o.fail(o.s.DownloadFloat32(o.out.data[:len(o.out.slots)*o.m.cfg.Vocab], o.logitsB))
	}
	o.out = nil
	return o.err
}

// replace swaps *b for a new buffer of size bytes once the device is done
// with the old one.
func (o *cudaOps) replace(b *cuda.Buffer, size int64) error {
	if err := o.s.Sync(); err != nil {
		return fmt.Errorf("model: cuda: %w", err)
	}
	for i, ob := range o.owned {
		if ob == *b {
			o.owned = append(o.owned[:i], o.owned[i+1:]...)
			break
		}
	}
	if err := o.dev.Free(*b); err != nil {
		return fmt.Errorf("model: cuda: %w", err)
	}
	*b = cuda.Buffer{}
	nb, err := o.alloc(size)
	if err != nil {
		return fmt.Errorf("model: cuda: %w", err)
	}
	*b = nb
	o.gen++
	return nil
}

// growActs sizes the activations for n slots (doubling, so a growing
// prefill reallocates rarely).
func (o *cudaOps) growActs(n int) error {
	if n <= o.actCap {
		return nil
	}
	c := max(n, 2*o.actCap, 8)
	for a := act(0); a < numActs; a++ {
		if err := o.replace(&o.acts[a], int64(c*o.m.cfg.width(a)*4)); err != nil {
			return err
		}
	}
	o.actCap = c
	return nil
}

func (o *cudaOps) embed(tokens []int32) error {
	if o.mode == replay {
		return o.err
	}
	m := o.m
	o.fail(o.s.Embed(o.acts[actX], o.mats[&m.embd.data[0]], m.embd.typ, m.cfg.Vocab, o.tokens, o.n, m.cfg.Dim))
	return o.err
}

func (o *cudaOps) useLayer(int, *layer) error { return o.err }

func (o *cudaOps) rmsNorm(dst, src act, w []float32) {
	if o.mode == replay {
		return
	}
	o.flush()
	o.fail(o.s.RMSNorm(o.acts[dst], o.acts[src], o.norms[&w[0]], cuda.Buffer{}, o.m.cfg.Dim, o.n, o.m.cfg.Eps))
}

func (o *cudaOps) matmul(dst act, w *matrix, src act) error {
	o.flush()
	if dst == actTmp {
		o.pending, o.pendingSrc = w, src
		return o.err
	}
	o.gemm(o.acts[dst], w, o.acts[src], o.n, false)
	return o.err
}

// flush launches a pending projection (only a recipe other than block's
// leaves one unmatched).
func (o *cudaOps) flush() {
	if w := o.pending; w != nil {
		o.pending = nil
		o.gemm(o.acts[actTmp], w, o.acts[o.pendingSrc], o.n, false)
	}
}

func (o *cudaOps) gemm(out cuda.Buffer, w *matrix, x cuda.Buffer, n int, add bool) {
	if o.err != nil || o.mode == replay {
		return
	}
	wb, ok := o.mats[&w.data[0]]
	if !ok {
		o.fail(fmt.Errorf("%s is not on the device", w.name))
		return
	}
	mm := o.s.MatMul
	if add {
		mm = o.s.MatMulAdd
	}
	if err := mm(out, wb, w.typ, w.rows, w.cols, x, n); err != nil {
		o.fail(fmt.Errorf("%s: %w", w.name, err))
	}
}

func (o *cudaOps) rope(pos []int32) {
	if o.mode == replay {
		return
	}
	o.flush()
	c := o.m.cfg
	o.fail(o.s.RoPE(o.acts[actQ], o.acts[actK], o.pos, o.n, c.Heads, c.KVHeads, c.HeadDim, c.RopeTheta))
}

func (o *cudaOps) storeKV(b *Batch, cache *kv.Cache, layer int) {
	if o.mode == replay {
		return
	}
	o.flush()
	o.fail(o.s.KVPut(o.kv.layout, layer, o.acts[actK], o.acts[actV], o.bases, o.slotRows, o.n))
}

func (o *cudaOps) attention(b *Batch, cache *kv.Cache, layer int) {
	if o.mode == replay {
		return
	}
	o.flush()
	c := o.m.cfg
	o.fail(o.s.Attention(o.kv.layout, layer, &cuda.Attention{
		Out: o.acts[actAtt], Q: o.acts[actQ], Bases: o.bases,
		Prefix: o.prefix, Anc: o.anc, Lo: o.lo, Hi: o.hi,
		N: o.n, Heads: c.Heads, KVHeads: c.KVHeads, Head: c.HeadDim, MaxLen: o.stride,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim))),
	}))
}

func (o *cudaOps) add(dst, src act) {
	if o.mode == replay {
		return
	}
	if w := o.pending; w != nil && src == actTmp {
		o.pending = nil
		o.gemm(o.acts[dst], w, o.acts[o.pendingSrc], o.n, true)
		return
	}
	o.flush()
	o.fail(o.s.Add(o.acts[dst], o.acts[src], o.n*o.m.cfg.width(dst)))
}

func (o *cudaOps) siluMul(gate, up act) {
	if o.mode == replay {
		return
	}
	o.flush()
	o.fail(o.s.SiLUMul(o.acts[gate], o.acts[up], o.n*o.m.cfg.width(gate)))
}

// logits normalises the wanted slots of actX into actXB (free by now)
// and multiplies them by the head; end downloads the rows.
func (o *cudaOps) logits(out *Logits, w *matrix) error {
	o.out = out
	if o.mode == replay {
		return o.err
	}
	o.flush()
	m := o.m
	rows := len(out.slots)
	o.fail(o.s.RMSNorm(o.acts[actXB], o.acts[actX], o.norms[&m.outNorm[0]], o.slots, m.cfg.Dim, rows, m.cfg.Eps))
	o.gemm(o.logitsB, w, o.acts[actXB], rows, false)
	return o.err
}

func (o *cudaOps) newCache(cfg kv.Config) (*kv.Cache, error) {
	g := &gpuRows{o: o, seqs: map[int]cuda.Buffer{},
		layout: cuda.KV{Layers: cfg.Layers, Context: cfg.Context, KVDim: cfg.KVDim, F16: cfg.Type == weights.F16}}
	cfg.Rows = g
	c, err := kv.New(cfg)
	if err != nil {
		return nil, err
	}
	o.rows = append(o.rows, g)
	return c, nil
}

func (o *cudaOps) close() error {
	if o.s == nil {
		return nil
	}
	o.dropGraphs()
	errs := []error{o.s.Close()}
	for _, b := range o.owned {
		errs = append(errs, o.dev.Free(b))
	}
	for _, g := range o.rows {
		for _, b := range g.seqs {
			errs = append(errs, o.dev.Free(b))
		}
		for _, b := range g.spare {
			errs = append(errs, o.dev.Free(b))
		}
		g.seqs, g.spare = nil, nil
	}
	errs = append(errs, o.dev.Close())
	o.s, o.owned, o.rows = nil, nil, nil
	return errors.Join(errs...)
}

// gpuRows keeps a KV cache's rows in device memory: one buffer per
// sequence in cuda.KV's layout, reused after Free. Valid until the model
// that made the cache closes.
type gpuRows struct {
	o      *cudaOps
	layout cuda.KV
	seqs   map[int]cuda.Buffer
	spare  []cuda.Buffer
}

func (g *gpuRows) Alloc(id int) error {
	if g.o.s == nil {
		return fmt.Errorf("model: the model that made this KV cache is closed")
	}
	if n := len(g.spare); n > 0 {
		g.seqs[id], g.spare = g.spare[n-1], g.spare[:n-1]
		return nil
	}
	b, err := g.o.dev.Alloc(g.layout.SeqBytes())
	if err != nil {
		return fmt.Errorf("model: KV rows on the GPU: %w", err)
	}
	g.seqs[id] = b
	return nil
}

func (g *gpuRows) Free(id int) {
	if b, ok := g.seqs[id]; ok {
		delete(g.seqs, id)
		g.spare = append(g.spare, b)
	}
}

func (g *gpuRows) Move(id int, dst, src []int) error {
	if g.o.s == nil {
		return fmt.Errorf("model: the model that made this KV cache is closed")
	}
	d := make([]int32, len(dst))
	s := make([]int32, len(src))
	for i := range dst {
		d[i], s[i] = int32(dst[i]), int32(src[i])
	}
	return g.o.s.KVMove(g.layout, g.seqs[id], d, s)
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
