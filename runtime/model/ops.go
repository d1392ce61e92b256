package model

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// act names an activation of the forward recipe: one vector per slot of
// the batch (Dim wide unless said).
type act int

const (
	actX   act = iota // the residual stream
	actXB             // normalised input of attention or the FFN
	actQ              // queries
	actK              // keys (KVDim)
	actV              // values (KVDim)
	actAtt            // attention output
	actTmp            // a projection back to Dim, added into actX
	actHB             // FFN gate (Hidden)
	actHB2            // FFN up (Hidden)
	numActs
)

// width is the length of one slot's vector of a.
func (c Config) width(a act) int {
	switch a {
	case actK, actV:
		return c.KVDim()
	case actHB, actHB2:
		return c.Hidden
	}
	return c.Dim
}

// ops are the steps of the forward recipe (forward, block, head), each
// over every slot of the batch begin was given. Backends implement them:
// hostOps with package kernels on the Model's buffers, and under the cuda
// build tag a GPU backend (ops_cuda.go) that keeps weights, activations
// and KV rows in device memory. The recipe itself exists once.
//
// Forward calls them from one goroutine, in recipe order, between begin
// and end. Steps with no error result cannot fail on the host; a GPU
// backend holds its first failure and returns it from the next step that
// has an error result, or from end. A backend may also record the steps
// of a pass and replay them for the next pass of the same shape.
type ops interface {
	// begin starts a pass over b: m.buf already holds each slot's KV row,
	// committed prefix and ancestor rows.
	begin(b *Batch, cache *kv.Cache) error
	// embed sets actX to the tokens' embedding rows.
	embed(tokens []int32) error
	// useLayer is called with each layer once its weights are readable,
	// before block computes it (a GPU backend copies streamed ones over).
	useLayer(li int, L *layer) error
	rmsNorm(dst, src act, w []float32)
	matmul(dst act, w *matrix, src act) error
	// rope rotates actQ and actK at the slots' positions.
	rope(pos []int32)
	// storeKV writes actK and actV into each slot's row of layer.
	storeKV(b *Batch, cache *kv.Cache, layer int)
	// attention sets actAtt from actQ and layer's KV rows.
	attention(b *Batch, cache *kv.Cache, layer int)
	add(dst, src act)
	siluMul(gate, up act)
	// logits sets out's rows (out.reset was called) from actX through
	// the output norm and w, by the time end returns.
	logits(out *Logits, w *matrix) error
	// end finishes the pass begin started; err is the pass's own error.
	end(err error) error
	// newCache makes a KV cache whose rows this backend can read.
	newCache(cfg kv.Config) (*kv.Cache, error)
	close() error
}

// ParseDevice reads a device name as Options.Device takes it: "" or
// "cpu" for the host kernels, "cuda" or "cuda:N" for GPU N (N ≥ 0; plain
// cuda is GPU 0). The error says what is wanted.
func ParseDevice(device string) (gpu bool, ordinal int, err error) {
	switch {
	case device == "" || device == "cpu":
		return false, 0, nil
	case device == "cuda":
		return true, 0, nil
	}
	if rest, ok := strings.CutPrefix(device, "cuda:"); ok {
		if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
			return true, n, nil
		}
		return false, 0, fmt.Errorf("model: device %q: want cuda:N with N a GPU number (0 is the first)", device)
	}
	return false, 0, fmt.Errorf("model: unknown device %q (want cpu, cuda or cuda:N)", device)
}

// newOps returns the backend that opt.Device names (see ParseDevice;
// GPUs need builds with -tags cuda).
func newOps(m *Model, device string) (ops, error) {
	gpu, ord, err := ParseDevice(device)
	switch {
	case err != nil:
		return nil, err
	case gpu:
		return newCUDAOps(m, ord)
	}
	return &hostOps{m: m}, nil
}

// hostOps computes on the CPU with package kernels (C or pure Go) and the
// Model's pool, on the activations in m.buf.
type hostOps struct {
	m        *Model
	n        int
	att      attendJob    // the layer's attention while the pool runs it
	attTasks []attendTask // its tasks' buffer, kept between layers
}

func (h *hostOps) buf(a act) []float32 {
	bf := &h.m.buf
	switch a {
	case actX:
		return bf.x
	case actXB:
		return bf.xb
	case actQ:
		return bf.q
	case actK:
		return bf.k
	case actV:
		return bf.v
	case actAtt:
		return bf.att
	case actTmp:
		return bf.tmp
	case actHB:
		return bf.hb
	case actHB2:
		return bf.hb2
	}
	panic(fmt.Sprintf("model: activation %d", a))
}

func (h *hostOps) begin(b *Batch, cache *kv.Cache) error {
	if cache.Config().Rows != nil {
		return fmt.Errorf("model: forward: the KV cache keeps its rows on a device, and this model computes on the CPU; make the cache with this model's NewCache")
	}
	h.n = len(b.Tokens)
	cfg := h.m.cfg
	bf := &h.m.buf
	bf.grow(h.n, cfg)
	half := cfg.HeadDim / 2
	for i, p := range b.Pos[:h.n] {
		kernels.RoPEAngles(bf.cos[i*half:(i+1)*half], bf.sin[i*half:(i+1)*half], cfg.HeadDim, int(p), cfg.RopeTheta)
	}
	return nil
}

func (h *hostOps) embed(tokens []int32) error {
	m := h.m
	dim := m.cfg.Dim
	embRow, err := m.embd.typ.RowBytes(uint64(dim))
	if err != nil {
		return fmt.Errorf("model: %s: %w", m.embd.name, err)
	}
	for i, tok := range tokens {
		src, err := m.embedRow(tok, embRow)
		if err != nil {
			return err
		}
		if err := weights.Dequantize(m.embd.typ, src, m.buf.x[i*dim:(i+1)*dim]); err != nil {
			return fmt.Errorf("model: %s row %d: %w", m.embd.name, tok, err)
		}
	}
	return nil
}

func (h *hostOps) useLayer(int, *layer) error { return nil }

func (h *hostOps) rmsNorm(dst, src act, w []float32) {
	dim := h.m.cfg.Dim
	d, s := h.buf(dst), h.buf(src)
	for i := 0; i < h.n; i++ {
		kernels.RMSNorm(d[i*dim:(i+1)*dim], s[i*dim:(i+1)*dim], w, h.m.cfg.Eps)
	}
}

// matmul computes dst = W·src for every slot, reading W once.
func (h *hostOps) matmul(dst act, w *matrix, src act) error {
	return h.m.matmul(h.buf(dst), w, h.buf(src), h.n)
}

func (m *Model) matmul(out []float32, w *matrix, x []float32, n int) error {
	if err := m.pool.MatMul(out[:n*w.rows], w.data, w.typ, w.rows, w.cols, x[:n*w.cols], n); err != nil {
		return fmt.Errorf("model: %s: %w", w.name, err)
	}
	return nil
}

// rope rotates with the angles begin computed for the batch's positions
// (pos, which every layer passes alike).
func (h *hostOps) rope([]int32) {
	cfg := h.m.cfg
	bf := &h.m.buf
	dim, kvd, half := cfg.Dim, cfg.KVDim(), cfg.HeadDim/2
	for i := 0; i < h.n; i++ {
		cos, sin := bf.cos[i*half:(i+1)*half], bf.sin[i*half:(i+1)*half]
		kernels.RoPERotate(bf.q[i*dim:(i+1)*dim], cfg.Heads, cfg.HeadDim, cos, sin)
		kernels.RoPERotate(bf.k[i*kvd:(i+1)*kvd], cfg.KVHeads, cfg.HeadDim, cos, sin)
	}
}

func (h *hostOps) storeKV(b *Batch, cache *kv.Cache, layer int) {
	bf := &h.m.buf
	kvd := h.m.cfg.KVDim()
	for i := 0; i < h.n; i++ {
		cache.Put(b.Seq[i], layer, int(bf.rows[i]), bf.k[i*kvd:(i+1)*kvd], bf.v[i*kvd:(i+1)*kvd])
	}
}

// attention runs one layer's attention on the pool, a task per group of
// query heads that share a KV head (grouped-query attention: head h
// reads KV head h/(Heads/KVHeads)) and run of slots of one sequence that
// share its cached prefix (a token tree's, or a prefill's), so a task
// reads its prefix's K and V rows once for all its heads and slots. Runs
// and then groups are split while there are fewer tasks than the workers
// the pool gives the job (attendJob.Units).
func (h *hostOps) attention(b *Batch, cache *kv.Cache, layer int) {
	m := h.m
	cfg := m.cfg
	bf := &m.buf
	n := h.n
	hd := cfg.HeadDim
	maxLen := 0
	for i := 0; i < n; i++ {
		maxLen = max(maxLen, bf.prefix[i]+bf.ancHi[i]-bf.ancLo[i])
	}
	h.att = attendJob{m: m, b: b, cache: cache, layer: layer, n: n, maxLen: maxLen, tasks: h.attTasks[:0],
		scale: float32(1 / math.Sqrt(float64(hd))), f16: cache.Config().Type == weights.F16}
	// Scores and values: two multiply-adds per head, row and element.
	m.pool.RunSizedWork(1, 2*float64(n*cfg.Heads*maxLen*hd), &h.att)
	h.attTasks = h.att.tasks[:0]
	h.att = attendJob{}
}

// attendJob is one layer's attention split over chunks of tasks, kept in
// hostOps so a layer allocates nothing.
type attendJob struct {
	m                   *Model
	b                   *Batch
	cache               *kv.Cache
	layer, n, maxLen    int
	heads, chunks, span int // set by Units
	tasks               []attendTask
	scale               float32
	f16                 bool
}

// attendTask is slots i0..i1-1, which share a sequence and its prefix,
// and the heads h0..h0+heads-1 of one KV head.
type attendTask struct{ i0, i1, h0 int }

// maxTreeScores bounds a task's scores (slots × heads × rows): a long
// prefill's chain is cut into runs of slots that keep it, so the scratch
// stays a few MiB whatever the prompt.
const maxTreeScores = 1 << 20

// Units cuts the layer into tasks and the tasks into chunks for workers:
// runs of slots are halved, then head groups, while there are fewer
// tasks than twice the workers, and each chunk (a few per worker balance
// tasks whose attention spans differ) owns a scores buffer.
func (j *attendJob) Units(workers int) int {
	cfg, bf := j.m.cfg, &j.m.buf
	j.heads = cfg.Heads / cfg.KVHeads
	longest := 1
	for i0 := 0; i0 < j.n; {
		i1 := j.runEnd(i0)
		longest = max(longest, i1-i0)
		i0 = i1
	}
	run := min(longest, max(1, maxTreeScores/(j.heads*j.maxLen)))
	for run > 1 && j.count(run, j.heads) < 2*workers {
		run = (run + 1) / 2
	}
	for j.heads%2 == 0 && j.count(run, j.heads) < 2*workers {
		j.heads /= 2
	}
	j.tasks = j.tasks[:0]
	for i0 := 0; i0 < j.n; {
		end := j.runEnd(i0)
		for s := i0; s < end; s += run {
			for h0 := 0; h0 < cfg.Heads; h0 += j.heads {
				j.tasks = append(j.tasks, attendTask{s, min(s+run, end), h0})
			}
		}
		i0 = end
	}
	j.chunks = min(len(j.tasks), 4*workers)
	j.span = run * j.heads * j.maxLen
	bf.scores = grow(bf.scores, j.chunks*j.span)
	return j.chunks
}

// runEnd is where the run of slots from i0 ends: the slots after it of
// the same sequence, which share its cached prefix.
func (j *attendJob) runEnd(i0 int) int {
	i1 := i0 + 1
	for i1 < j.n && j.b.Seq[i1] == j.b.Seq[i0] {
		i1++
	}
	return i1
}

// count is how many tasks runs of at most run slots and groups of heads
// heads make.
func (j *attendJob) count(run, heads int) int {
	tasks := 0
	for i0 := 0; i0 < j.n; {
		i1 := j.runEnd(i0)
		tasks += (i1 - i0 + run - 1) / run
		i0 = i1
	}
	return tasks * (j.m.cfg.Heads / heads)
}

func (j *attendJob) Run(lo, hi int) {
	cfg, bf := j.m.cfg, &j.m.buf
	dim, kvd, hd := cfg.Dim, cfg.KVDim(), cfg.HeadDim
	group, heads := cfg.Heads/cfg.KVHeads, j.heads
	for c := lo; c < hi; c++ {
		sc := bf.scores[c*j.span : (c+1)*j.span]
		for t := c * len(j.tasks) / j.chunks; t < (c+1)*len(j.tasks)/j.chunks; t++ {
			task := j.tasks[t]
			i0, i1, h0 := task.i0, task.i1, task.h0
			seq := j.b.Seq[i0]
			off := (h0 / group) * hd
			// Slot i's heads sit dim apart from slot i-1's.
			q := bf.q[i0*dim+h0*hd : (i1-1)*dim+(h0+heads)*hd]
			o := bf.att[i0*dim+h0*hd : (i1-1)*dim+(h0+heads)*hd]
			anc, alo, ahi := bf.anc[:bf.ancHi[i1-1]], bf.ancLo[i0:i1], bf.ancHi[i0:i1]
			if j.f16 {
				kernels.AttentionTreeF16(o, q, j.cache.K16(seq, j.layer), j.cache.V16(seq, j.layer), heads, i1-i0, dim, kvd, off, bf.prefix[i0], anc, alo, ahi, j.scale, sc)
			} else {
				kernels.AttentionTree(o, q, j.cache.K(seq, j.layer), j.cache.V(seq, j.layer), heads, i1-i0, dim, kvd, off, bf.prefix[i0], anc, alo, ahi, j.scale, sc)
			}
		}
	}
}

func (h *hostOps) add(dst, src act) {
	w := h.m.cfg.width(dst)
	kernels.Add(h.buf(dst)[:h.n*w], h.buf(src)[:h.n*w])
}

func (h *hostOps) siluMul(gate, up act) {
	w := h.m.cfg.width(gate)
	kernels.SiLUMul(h.buf(gate)[:h.n*w], h.buf(up)[:h.n*w])
}

func (h *hostOps) logits(out *Logits, w *matrix) error {
	m := h.m
	bf := &m.buf
	dim := m.cfg.Dim
	rows := len(out.slots)
	bf.xs = grow(bf.xs, rows*dim)
	for j, i := range out.slots {
		kernels.RMSNorm(bf.xs[j*dim:(j+1)*dim], bf.x[i*dim:(i+1)*dim], m.outNorm, m.cfg.Eps)
	}
	return m.matmul(out.data, w, bf.xs, rows)
}

func (h *hostOps) end(err error) error { return err }

func (h *hostOps) newCache(cfg kv.Config) (*kv.Cache, error) { return kv.New(cfg) }

func (h *hostOps) close() error { return nil }
