//go:build cuda

package model

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/kernels/cuda"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// cudaOps computes the forward recipe on a GPU. The weights are copied to
// device memory once at Load, activations stay on the device between
// steps, and KV rows live in device memory owned by the caches that
// newCache makes (gpuRows): a commit compacts them there. Per pass, the
// host uploads the batch's small tables once and downloads only logits.
// A model whose weights stream under a budget keeps only its pinned
// groups on the device and streams the others through a few fixed slots
// (gpuStream).
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

	// w is each layer matrix's device copy: resident, or the slot it was
	// streamed into for the current pass (keyed by its place in m.layers).
	w     map[*matrix]cuda.Buffer
	embd  cuda.Buffer              // token_embd; empty when its rows stream from the host
	head  cuda.Buffer              // the output head; empty when it streams
	norms map[*float32]cuda.Buffer // norm vectors
	owned []cuda.Buffer            // everything to free on close
	rows  []*gpuRows               // the KV stores of caches made by newCache
	st    *gpuStream               // nil when every weight is resident
	rowsF []float32                // embedding rows dequantized on the host

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

// gpuStream moves the groups a Streamer does not pin (weights.Streamer:
// one per layer, the output head, an untied embedding) to the GPU during
// each pass. Pinned groups are uploaded to the device once at Load. Each
// streamed group goes, in forward order, into the next of streamSlots
// device slots of the largest streamed group's size, on the upload queue
// (cuda.Uploader, through a few pinned staging chunks): the copy of group
// i+1 runs while group i computes. Two events per slot order it:
// uploaded (compute waits on it before reading the slot) and read
// (recorded after the compute that reads the slot, which the next copy
// into the slot waits for). The host waits for a group's copy before
// the recipe hands the group back to the Streamer, so the Streamer's
// window is never read after release, and its reader fills the window
// with later groups meanwhile, as on the CPU.
//
// Memory: the budget (weights.StreamOptions.Budget) bounds host RAM, the
// Streamer's pinned groups and window. The GPU holds, on top of the
// pinned groups' copies, streamSlots × the largest streamed group plus
// repack scratch of the largest streamed Q8_0/Q4_0 matrix; the host
// holds the staging chunks (at most stagingChunks × stagingChunk bytes
// of pinned memory). On a Jetson both are the same DRAM.
//
// Streamed passes run eagerly, never as CUDA graphs: a replay launches a
// whole recorded pass at once, while a streamed pass must interleave the
// host's Acquire of each group, its copy and its compute; and such a pass
// is bound by moving its weights (milliseconds per layer), not by the
// microseconds of its kernel launches. A budget that pins every group
// streams nothing and keeps the graphs.
type gpuStream struct {
	up      *cuda.Uploader
	slots   []streamSlot
	scratch cuda.Buffer // Q8_0/Q4_0 bytes before their repack
	pinned  []bool      // per group: its copy is resident on the device
	any     bool        // some group streams
	next    int         // the slot the next streamed group goes into
	reading int         // the slot compute queued so far reads; -1: none
}

type streamSlot struct {
	buf            cuda.Buffer
	uploaded, read *cuda.Event
}

// streamSlots is how many streamed groups the GPU holds: two, so one
// uploads while the other computes. More would only let uploads run
// further ahead, which the host cannot do: it acquires the groups one at
// a time, in the order the recipe computes them.
const streamSlots = 2

// Each copy to a slot is staged through stagingChunks pinned buffers of
// stagingChunk bytes (fewer for a smaller model): the host fills one
// while the GPU copies the other. 4 MiB makes per-copy costs vanish and
// is small next to a layer; a variable so that tests run the ring on
// small models.
const stagingChunks = 2

var stagingChunk = 4 << 20

// allocLimit, when positive, fails the model's device allocations past
// that many bytes as a full GPU would: a test seam for a small device.
var allocLimit int64

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
	dev, err := cuda.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	o := &cudaOps{m: m, dev: dev, w: map[*matrix]cuda.Buffer{}, norms: map[*float32]cuda.Buffer{}, graphs: map[graphKey]*cuda.Graph{}}
	if o.s, err = dev.NewStream(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := o.checkTypes(); err != nil {
		o.close()
		return nil, err
	}
	if m.stream != nil {
		err = o.uploadStreamed()
	} else {
		err = o.upload()
	}
	if err == nil {
		err = o.uploadNorms()
	}
	if err != nil {
		o.close()
		return nil, err
	}
	return o, nil
}

// gpuMats are a layer's matrices in the order its streamed group holds
// them (layerMatrices).
func gpuMats(L *layer) []*matrix {
	return []*matrix{&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.down, &L.up}
}

// matBytes is a matrix's size in the file and on the device (Load checked
// that its type has a row size).
func matBytes(w *matrix) int64 {
	rb, _ := w.typ.RowBytes(uint64(w.cols))
	return int64(rb) * int64(w.rows)
}

// checkTypes refuses, before anything is copied, a matrix the GPU has no
// kernel for, streamed ones included.
func (o *cudaOps) checkTypes() error {
	m := o.m
	mats := []*matrix{&m.embd, &m.output}
	for i := range m.layers {
		mats = append(mats, gpuMats(&m.layers[i])...)
	}
	for _, w := range mats {
		if !gpuType(w.typ) {
			return fmt.Errorf("model: %s: tensor %s is %s, which the GPU has no kernel for (GPU types: %v); convert the model: tandem convert --type q8_0",
				m.file.Path, w.name, w.typ, cuda.MatMulTypes)
		}
	}
	return nil
}

// upload copies every matrix of a resident model to the device.
func (o *cudaOps) upload() error {
	m := o.m
	put := func(w *matrix) (cuda.Buffer, error) {
		b, err := o.alloc(matBytes(w))
		if err != nil {
			return b, fmt.Errorf("model: %s on the GPU: %w", w.name, err)
		}
		if err := o.s.UploadWeights(b, w.data, w.typ, w.rows, w.cols); err != nil {
			return b, fmt.Errorf("model: %s on the GPU: %w", w.name, err)
		}
		return b, nil
	}
	var err error
	if o.embd, err = put(&m.embd); err != nil {
		return err
	}
	o.head = o.embd // the output head tied to the embedding
	if !m.cfg.Tied {
		if o.head, err = put(&m.output); err != nil {
			return err
		}
	}
	for i := range m.layers {
		for _, w := range gpuMats(&m.layers[i]) {
			if o.w[w], err = put(w); err != nil {
				return err
			}
		}
	}
	return nil
}

// uploadNorms copies the norm vectors, which are never streamed.
func (o *cudaOps) uploadNorms() error {
	m := o.m
	norms := [][]float32{m.outNorm}
	for i := range m.layers {
		norms = append(norms, m.layers[i].attnNorm, m.layers[i].ffnNorm)
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

// uploadStreamed sets up a model whose weights stream (see gpuStream):
// the slots first, which are the least the GPU needs, then the copies of
// the pinned groups.
func (o *cudaOps) uploadStreamed() error {
	m := o.m
	plan := m.stream.Plan()
	groups := streamGroups(m.cfg)
	st := &gpuStream{pinned: plan.Pinned, reading: -1}
	o.st = st
	mats := make([][]*matrix, len(groups)) // each group's matrices, in Acquire's order
	for g := range groups {
		switch {
		case g < m.cfg.Layers:
			mats[g] = gpuMats(&m.layers[g])
		case g == m.cfg.Layers:
			mats[g] = []*matrix{&m.output} // token_embd when tied
		default:
			mats[g] = []*matrix{&m.embd}
		}
	}
	var slotBytes, scratchBytes, largest int64
	for g, ws := range mats {
		var n int64
		for _, w := range ws {
			largest = max(largest, matBytes(w))
			if plan.Pinned[g] || groups[g].Rows {
				continue
			}
			n += alignSlot(matBytes(w))
			if w.typ == weights.Q8_0 || w.typ == weights.Q4_0 {
				scratchBytes = max(scratchBytes, matBytes(w))
			}
		}
		slotBytes = max(slotBytes, n)
		// A row-read group (the untied embedding) never streams whole:
		// Forward reads its rows on the host.
		st.any = st.any || !plan.Pinned[g]
	}
	dev := o.dev.String()
	if slotBytes > 0 {
		for i := 0; i < streamSlots; i++ {
			b, err := o.alloc(slotBytes)
			if err == nil && i == 0 && scratchBytes > 0 {
				st.scratch, err = o.alloc(scratchBytes)
			}
			if err != nil {
				return fmt.Errorf("model: streaming %s to %s: %d slots of %s (the largest streamed group, each) and %s of repack scratch do not fit: %w. "+
					"The budget (%s) bounds host RAM only; these slots are device memory on top of it and the least this model needs on the GPU: free device memory or use a GPU with more",
					m.file.Path, dev, streamSlots, progress.Bytes(uint64(slotBytes)), progress.Bytes(uint64(scratchBytes)), err, progress.Bytes(plan.Budget))
			}
			sl := streamSlot{buf: b}
			if sl.uploaded, err = o.s.NewEvent(); err == nil {
				sl.read, err = o.s.NewEvent()
			}
			st.slots = append(st.slots, sl)
			if err != nil {
				return fmt.Errorf("model: %w", err)
			}
		}
	}
	chunk := int(min(int64(stagingChunk), (largest+0xffff)&^0xffff))
	var err error
	if st.up, err = o.s.NewUploader(stagingChunks, chunk); err != nil {
		return fmt.Errorf("model: streaming %s to %s: %w", m.file.Path, dev, err)
	}
	for g, ws := range mats {
		if !plan.Pinned[g] {
			continue
		}
		views, _ := m.stream.Pinned(g)
		bufs := make([]cuda.Buffer, len(ws))
		for i, w := range ws {
			if bufs[i], err = o.pin(w, views[i]); err != nil {
				return fmt.Errorf("model: %s: pinned group %s on %s: %w. The budget (%s) bounds host RAM; the %s of groups it pins also stay resident on the GPU, next to %d streaming slots of %s: a smaller budget pins less there",
					m.file.Path, groups[g].Name, dev, err, progress.Bytes(plan.Budget), progress.Bytes(plan.PinBytes), len(st.slots), progress.Bytes(uint64(slotBytes)))
			}
		}
		switch {
		case g < m.cfg.Layers:
			for i, w := range ws {
				o.w[w] = bufs[i]
			}
		case g == m.cfg.Layers:
			o.head = bufs[0]
			if m.cfg.Tied {
				o.embd = bufs[0]
			}
		default:
			o.embd = bufs[0]
		}
	}
	return nil
}

// pin copies a pinned group's matrix to a device buffer of its own.
func (o *cudaOps) pin(w *matrix, data []byte) (cuda.Buffer, error) {
	b, err := o.alloc(matBytes(w))
	if err != nil {
		return b, fmt.Errorf("%s: %w", w.name, err)
	}
	scratch := o.st.scratch
	if (w.typ == weights.Q8_0 || w.typ == weights.Q4_0) && int64(len(data)) > scratch.Size() {
		// Larger than any streamed matrix (an embedding): scratch for this
		// copy alone.
		tmp, err := o.dev.Alloc(int64(len(data)))
		if err != nil {
			return b, fmt.Errorf("%s: repack scratch: %w", w.name, err)
		}
		defer o.dev.Free(tmp)
		defer o.s.Sync() // before tmp is freed
		scratch = tmp
	}
	if err := o.st.up.Weights(b, scratch, data, w.typ, w.rows, w.cols); err != nil {
		return b, fmt.Errorf("%s: %w", w.name, err)
	}
	return b, nil
}

// alignSlot places matrices in a slot at 256-byte boundaries, as
// cuMemAlloc aligns buffers.
func alignSlot(n int64) int64 { return (n + 255) &^ 255 }

func gpuType(t weights.DType) bool {
	for _, g := range cuda.MatMulTypes {
		if g == t {
			return true
		}
	}
	return false
}

func (o *cudaOps) alloc(n int64) (cuda.Buffer, error) {
	if allocLimit > 0 {
		var used int64
		for _, b := range o.owned {
			used += b.Size()
		}
		if used+n > allocLimit {
			return cuda.Buffer{}, fmt.Errorf("cuda: GPU %d: allocating %d bytes (%d of a %d-byte test limit in use): out of memory", o.dev.Ordinal, n, used, allocLimit)
		}
	}
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
	graph := n <= graphSlots && (o.st == nil || !o.st.any)
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
	o.doneReading()
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
	if o.mode == replay || o.err != nil {
		return o.err
	}
	m := o.m
	if o.embd.Size() > 0 {
		o.fail(o.s.Embed(o.acts[actX], o.embd, m.embd.typ, m.cfg.Vocab, o.tokens, o.n, m.cfg.Dim))
		return o.err
	}
	// A streamed embedding: the host reads the rows (as the CPU does, and
	// the embed kernel is bit-exact with its dequantization) and uploads
	// them.
	dim := m.cfg.Dim
	rowBytes, err := m.embd.typ.RowBytes(uint64(dim))
	if err != nil {
		return fmt.Errorf("model: %s: %w", m.embd.name, err)
	}
	o.rowsF = grow(o.rowsF, len(tokens)*dim)
	for i, tok := range tokens {
		src, err := m.embedRow(tok, rowBytes)
		if err != nil {
			return err
		}
		if err := weights.Dequantize(m.embd.typ, src, o.rowsF[i*dim:(i+1)*dim]); err != nil {
			return fmt.Errorf("model: %s row %d: %w", m.embd.name, tok, err)
		}
	}
	o.fail(o.s.UploadFloat32(o.acts[actX], o.rowsF[:len(tokens)*dim]))
	return o.err
}

// useLayer streams layer li into a slot unless it is resident.
func (o *cudaOps) useLayer(li int, L *layer) error {
	if o.err != nil {
		return o.err
	}
	o.flush() // the last layer's kernels are queued before its slot is marked read
	o.doneReading()
	if o.st == nil || o.st.pinned[li] {
		return o.err
	}
	mats := gpuMats(L)
	bufs, err := o.streamIn(mats)
	if err != nil {
		return err
	}
	for i, w := range mats {
		o.w[w] = bufs[i]
	}
	return nil
}

// streamIn copies a streamed group's matrices (their data are the
// Streamer's views) into the next slot and makes the compute queued from
// now on wait for them. It returns once the copy is done, so the caller
// may release the group to the Streamer; the compute queued before, on
// the other slot, runs meanwhile.
func (o *cudaOps) streamIn(mats []*matrix) ([]cuda.Buffer, error) {
	st := o.st
	k := st.next
	st.next = (k + 1) % len(st.slots)
	sl := &st.slots[k]
	// The slot's last reader, recorded by doneReading, must finish
	// before the first byte lands.
	st.up.WaitBefore(sl.read)
	bufs := make([]cuda.Buffer, len(mats))
	var off int64
	for i, w := range mats {
		n := matBytes(w)
		bufs[i] = sl.buf.Slice(off, n)
		off += alignSlot(n)
		if err := st.up.Weights(bufs[i], st.scratch, w.data, w.typ, w.rows, w.cols); err != nil {
			o.fail(fmt.Errorf("streaming %s: %w", w.name, err))
			return nil, o.err
		}
	}
	o.fail(st.up.Record(sl.uploaded))
	o.fail(o.s.ComputeWait(sl.uploaded))
	st.reading = k
	o.fail(o.s.SyncEvent(sl.uploaded))
	return bufs, o.err
}

// doneReading records, after the compute queued so far, that the slot it
// reads is free for the next copy into it.
func (o *cudaOps) doneReading() {
	if st := o.st; st != nil && st.reading >= 0 {
		o.fail(o.s.RecordCompute(st.slots[st.reading].read))
		st.reading = -1
	}
}

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
	o.gemm(o.acts[dst], o.weight(w), w, o.acts[src], o.n, false)
	return o.err
}

// weight is a layer matrix's device copy (an empty Buffer fails gemm).
func (o *cudaOps) weight(w *matrix) cuda.Buffer { return o.w[w] }

// flush launches a pending projection (only a recipe other than block's
// leaves one unmatched).
func (o *cudaOps) flush() {
	if w := o.pending; w != nil {
		o.pending = nil
		o.gemm(o.acts[actTmp], o.weight(w), w, o.acts[o.pendingSrc], o.n, false)
	}
}

func (o *cudaOps) gemm(out, wb cuda.Buffer, w *matrix, x cuda.Buffer, n int, add bool) {
	if o.err != nil || o.mode == replay {
		return
	}
	if wb.Size() == 0 {
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
		o.gemm(o.acts[dst], o.weight(w), w, o.acts[o.pendingSrc], o.n, true)
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
	head := o.head
	if o.st != nil && !o.st.pinned[m.cfg.Layers] && o.err == nil {
		o.doneReading()
		bufs, err := o.streamIn([]*matrix{w})
		if err != nil {
			return err
		}
		head = bufs[0]
	}
	rows := len(out.slots)
	o.fail(o.s.RMSNorm(o.acts[actXB], o.acts[actX], o.norms[&m.outNorm[0]], o.slots, m.cfg.Dim, rows, m.cfg.Eps))
	o.gemm(o.logitsB, head, w, o.acts[actXB], rows, false)
	return o.err
}

func (o *cudaOps) newCache(cfg kv.Config) (*kv.Cache, error) {
	g := &gpuRows{o: o, seqs: map[int]cuda.Buffer{},
		layout: cuda.KV{Layers: cfg.Layers, Context: cfg.SeqRows(), KVDim: cfg.KVDim, F16: cfg.Type == weights.F16}}
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
	errs := []error{o.s.Close()} // waits for every queue
	if st := o.st; st != nil {
		errs = append(errs, st.up.Close())
		for _, sl := range st.slots {
			errs = append(errs, sl.uploaded.Close(), sl.read.Close())
		}
		o.st = nil
	}
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

// Release implements kv.RowReleaser: the spare buffers go back to the
// device once the work queued so far is done.
func (g *gpuRows) Release() error {
	if g.o.s == nil || len(g.spare) == 0 {
		return nil
	}
	errs := []error{g.o.s.Sync()}
	for _, b := range g.spare {
		errs = append(errs, g.o.dev.Free(b))
	}
	g.spare = nil
	return errors.Join(errs...)
}

// CopyRows implements kv.RowCopier.
func (g *gpuRows) CopyRows(dst, src, n int) error {
	if g.o.s == nil {
		return fmt.Errorf("model: the model that made this KV cache is closed")
	}
	return g.o.s.KVCopy(g.layout, g.seqs[dst], g.seqs[src], n)
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
