package train

import (
	"errors"
	"fmt"
	"math"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
)

// ErrNonFinite is returned (wrapped with the step and the layer) when a
// loss or gradient becomes NaN or infinite.
var ErrNonFinite = errors.New("non-finite value")

// Batch is B sequences of T tokens trained on together. Sequence b is
// Tokens[b*T:(b+1)*T] at positions 0..T-1, a causal window exactly as
// runtime/model sees a prefill.
type Batch struct {
	B, T    int
	Tokens  []int32 // B*T input tokens
	Targets []int32 // B*T next tokens; -1 = no loss at this position
	// Soft, when set, holds B*T*Vocab teacher probabilities: the loss is
	// then the KL divergence from them (distillation), at the positions
	// whose Targets are not -1.
	Soft []float32
}

// layerActs are the activations of one block that backward needs.
type layerActs[T Float] struct {
	xIn  []T // block input (the residual stream)
	an   []T // attn_norm output
	r1   []T // its 1/rms per row
	q, k []T // after RoPE
	v    []T
	p    []T // attention probabilities, B×Heads×T×T (row t: weights over s ≤ t)
	att  []T // attention output, before attn_output
	xMid []T // residual after attention
	fn   []T // ffn_norm output
	r2   []T
	g, u []T // gate and up projections
	h    []T // silu(g)·u
}

// Engine runs the forward and backward passes of one model shape. It
// keeps the activations of the last Forward for Backward and reuses its
// buffers across steps; it is not safe for concurrent use.
type Engine[T Float] struct {
	cfg      model.Config
	pool     *kernels.Pool
	b, t     int
	cos, sin []T // RoPE table: Context × HeadDim/2

	acts                []layerActs[T]
	xOut, y, rf, logits []T
	dlogits             []T
	rowLoss             []float64
	count               int
	tokens              []int32 // the last Forward's inputs, for the embedding gradient

	// backward buffers
	dx, dxm, da, df, dq, dk, dv, datt, dh, dg, du []T
	aT, fT                                        []T
	sc                                            scratch[T]
}

// NewEngine makes an engine for shape c computing on pool.
func NewEngine[T Float](c model.Config, pool *kernels.Pool) (*Engine[T], error) {
	if err := CheckConfig(c); err != nil {
		return nil, err
	}
	c.HeadDim = c.Dim / c.Heads
	e := &Engine[T]{cfg: c, pool: pool}
	half := c.HeadDim / 2
	e.cos = make([]T, c.Context*half)
	e.sin = make([]T, c.Context*half)
	// The runtime's angles, so the trainer rotates exactly as it does.
	cos, sin := make([]float32, half), make([]float32, half)
	for pos := 0; pos < c.Context; pos++ {
		kernels.RoPEAngles(cos, sin, c.HeadDim, pos, c.RopeTheta)
		for i := range half {
			e.cos[pos*half+i], e.sin[pos*half+i] = T(cos[i]), T(sin[i])
		}
	}
	return e, nil
}

// Config is the engine's model shape.
func (e *Engine[T]) Config() model.Config { return e.cfg }

// activationElems counts the elements size allocates for b sequences of
// t tokens, in float64 so that absurd batches do not overflow: the T
// buffers, and the float64 per-row losses apart. TestActivationElems
// keeps the two in step.
func activationElems(c model.Config, b, t int) (ts, f64s float64) {
	n, d, kvd, hid := float64(b)*float64(t), float64(c.Dim), float64(c.KVHeads*(c.Dim/c.Heads)), float64(c.Hidden)
	perLayer := n*(6*d+2+2*kvd+3*hid) + float64(b)*float64(c.Heads)*float64(t)*float64(t)
	ts = n*d + float64(c.Layers)*perLayer + // the first block's input, the blocks
		n*(d+1+2*float64(c.Vocab)) + // final norm, logits and their gradient
		n*(8*d+2*kvd+3*hid) // the backward pass's buffers
	return ts, n
}

// size (re)allocates the activation buffers for B sequences of T tokens.
func (e *Engine[T]) size(b, t int) {
	if e.b == b && e.t == t {
		return
	}
	e.b, e.t = b, t
	c := e.cfg
	n, d, kvd, hid := b*t, c.Dim, c.KVHeads*c.HeadDim, c.Hidden
	mk := func(k int) []T { return make([]T, k) }
	e.acts = make([]layerActs[T], c.Layers)
	for l := range e.acts {
		A := &e.acts[l]
		if l == 0 {
			A.xIn = mk(n * d)
		}
		A.an, A.r1 = mk(n*d), mk(n)
		A.q, A.k, A.v = mk(n*d), mk(n*kvd), mk(n*kvd)
		A.p = mk(b * c.Heads * t * t)
		A.att, A.xMid, A.fn, A.r2 = mk(n*d), mk(n*d), mk(n*d), mk(n)
		A.g, A.u, A.h = mk(n*hid), mk(n*hid), mk(n*hid)
		next := mk(n * d) // the block's output is the next block's input
		if l+1 < c.Layers {
			e.acts[l+1].xIn = next
		} else {
			e.xOut = next
		}
	}
	e.y, e.rf = mk(n*d), mk(n)
	e.logits, e.dlogits = mk(n*c.Vocab), mk(n*c.Vocab)
	e.rowLoss = make([]float64, n)
	e.dx, e.dxm, e.da, e.df, e.datt = mk(n*d), mk(n*d), mk(n*d), mk(n*d), mk(n*d)
	e.dq, e.dk, e.dv = mk(n*d), mk(n*kvd), mk(n*kvd)
	e.dh, e.dg, e.du = mk(n*hid), mk(n*hid), mk(n*hid)
	e.aT, e.fT = mk(n*d), mk(n*d)
}

func (e *Engine[T]) check(p *Params[T], b *Batch) error {
	c := e.cfg
	if p.Cfg.Dim != c.Dim || p.Cfg.Hidden != c.Hidden || p.Cfg.Layers != c.Layers || p.Cfg.Heads != c.Heads ||
		p.Cfg.KVHeads != c.KVHeads || p.Cfg.Vocab != c.Vocab || p.Cfg.Tied != c.Tied {
		return fmt.Errorf("train: parameters of shape %s do not match the engine's %s", ShapeString(p.Cfg), ShapeString(c))
	}
	if b.B <= 0 || b.T <= 0 || b.T > c.Context {
		return fmt.Errorf("train: batch of %d sequences of %d tokens: want at least one sequence of 1..%d (the context) tokens", b.B, b.T, c.Context)
	}
	n := b.B * b.T
	if len(b.Tokens) != n || len(b.Targets) != n {
		return fmt.Errorf("train: batch has %d tokens and %d targets, want %d (%d×%d)", len(b.Tokens), len(b.Targets), n, b.B, b.T)
	}
	if b.Soft != nil && len(b.Soft) != n*c.Vocab {
		return fmt.Errorf("train: batch has %d soft targets, want %d (%d positions × vocabulary %d)", len(b.Soft), n*c.Vocab, n, c.Vocab)
	}
	for i := range n {
		if t := b.Tokens[i]; t < 0 || int(t) >= c.Vocab {
			return fmt.Errorf("train: batch token %d is %d, outside the vocabulary of %d", i, t, c.Vocab)
		}
		if t := b.Targets[i]; t < -1 || int(t) >= c.Vocab {
			return fmt.Errorf("train: batch target %d is %d, outside the vocabulary of %d (or -1)", i, t, c.Vocab)
		}
	}
	return nil
}

// Forward runs the model over the batch, keeps the activations for
// Backward and returns the mean loss per target position (cross-entropy,
// or KL divergence to Batch.Soft) in nats. A batch with no targets has
// loss 0.
func (e *Engine[T]) Forward(p *Params[T], b *Batch) (float64, error) {
	if err := e.check(p, b); err != nil {
		return 0, err
	}
	e.size(b.B, b.T)
	c := e.cfg
	n, d, kvd, hid := b.B*b.T, c.Dim, c.KVHeads*c.HeadDim, c.Hidden
	pool := e.pool
	e.tokens = append(e.tokens[:0], b.Tokens...)
	x := e.acts[0].xIn
	for i, tok := range b.Tokens {
		copy(x[i*d:(i+1)*d], p.Emb[int(tok)*d:(int(tok)+1)*d])
	}
	eps := T(c.Eps)
	tmp := e.da // free until backward
	for l := range c.Layers {
		A, L := &e.acts[l], &p.Layers[l]
		out := e.xOut
		if l+1 < c.Layers {
			out = e.acts[l+1].xIn
		}
		rmsNorm(pool, A.an, A.r1, A.xIn, L.AttnNorm, n, d, eps)
		linear(pool, A.q, L.Wq, A.an, d, d, n)
		linear(pool, A.k, L.Wk, A.an, kvd, d, n)
		linear(pool, A.v, L.Wv, A.an, kvd, d, n)
		e.rope(A.q, c.Heads, b.T, 1)
		e.rope(A.k, c.KVHeads, b.T, 1)
		e.attention(A)
		linear(pool, tmp, L.Wo, A.att, d, d, n)
		sum(pool, A.xMid[:n*d], A.xIn[:n*d], tmp[:n*d])
		rmsNorm(pool, A.fn, A.r2, A.xMid, L.FFNNorm, n, d, eps)
		linear(pool, A.g, L.Gate, A.fn, hid, d, n)
		linear(pool, A.u, L.Up, A.fn, hid, d, n)
		swiglu(pool, A.h[:n*hid], A.g[:n*hid], A.u[:n*hid])
		linear(pool, tmp, L.Down, A.h, d, hid, n)
		sum(pool, out[:n*d], A.xMid[:n*d], tmp[:n*d])
	}
	rmsNorm(pool, e.y, e.rf, e.xOut, p.OutNorm, n, d, eps)
	linear(pool, e.logits, p.Out, e.y, c.Vocab, d, n)
	return e.loss(b), nil
}

// Logits returns the output rows of the last Forward: position i of the
// batch is Logits()[i*Vocab:(i+1)*Vocab].
func (e *Engine[T]) Logits() []T { return e.logits[:e.b*e.t*e.cfg.Vocab] }

// loss computes the mean loss and its gradient with respect to the
// logits (stored for Backward). Rows are independent; their losses are
// summed in order, so the result does not depend on the thread count.
func (e *Engine[T]) loss(b *Batch) float64 {
	V := e.cfg.Vocab
	n := b.B * b.T
	e.count = 0
	for _, t := range b.Targets {
		if t >= 0 {
			e.count++
		}
	}
	inv := 0.0
	if e.count > 0 {
		inv = 1 / float64(e.count)
	}
	e.pool.Run(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := e.logits[i*V : (i+1)*V]
			grad := e.dlogits[i*V : (i+1)*V]
			tgt := b.Targets[i]
			if tgt < 0 {
				clear(grad)
				e.rowLoss[i] = 0
				continue
			}
			mx := row[0]
			for _, v := range row[1:] {
				mx = max(mx, v)
			}
			var z float64
			for j, v := range row {
				ex := math.Exp(float64(v - mx))
				grad[j] = T(ex)
				z += ex
			}
			lse := float64(mx) + math.Log(z)
			iz := 1 / z
			if b.Soft == nil {
				for j := range grad {
					grad[j] = T(float64(grad[j]) * iz * inv)
				}
				grad[tgt] -= T(inv)
				e.rowLoss[i] = lse - float64(row[tgt])
				continue
			}
			soft := b.Soft[i*V : (i+1)*V]
			var kl float64
			for j := range grad {
				pj := float64(soft[j])
				if pj > 0 {
					kl += pj * (math.Log(pj) - (float64(row[j]) - lse))
				}
				grad[j] = T((float64(grad[j])*iz - pj) * inv)
			}
			e.rowLoss[i] = kl
		}
	})
	var total float64
	for _, l := range e.rowLoss[:n] {
		total += l
	}
	return total * inv
}

// rope rotates the adjacent pairs of each head of x (n rows of heads×hd)
// by the angle of the row's position (row i of a sequence is position
// i mod T); dir -1 rotates back, which is RoPE's backward (a rotation's
// transpose is its inverse).
func (e *Engine[T]) rope(x []T, heads, t int, dir T) {
	hd := e.cfg.HeadDim
	half := hd / 2
	w := heads * hd
	rows := len(x) / w
	e.pool.Run(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			pos := r % t
			cs, sn := e.cos[pos*half:(pos+1)*half], e.sin[pos*half:(pos+1)*half]
			row := x[r*w : (r+1)*w]
			for h := 0; h < heads; h++ {
				v := row[h*hd : (h+1)*hd]
				for i := 0; i < half; i++ {
					c, s := cs[i], dir*sn[i]
					v0, v1 := v[2*i], v[2*i+1]
					v[2*i] = v0*c - v1*s
					v[2*i+1] = v0*s + v1*c
				}
			}
		}
	})
}

// attention computes softmax(q·kᵀ/√hd)·v per sequence and head, causal,
// keeping the probabilities. A task is one sequence and one KV head with
// the query heads that share it; its products run as serial matmuls so
// tasks run in parallel.
func (e *Engine[T]) attention(A *layerActs[T]) {
	c := e.cfg
	Tn, hd, d := e.t, c.HeadDim, c.Dim
	group := c.Heads / c.KVHeads
	scale := T(float32(1 / math.Sqrt(float64(hd))))
	e.kvTasks(A, func(sp *kernels.Pool, sc *scratch[T], b, kh int, kH, vH []T) {
		vT := sc.get(2, hd*Tn)
		transpose(nil, vT, vH, Tn, hd)
		for g := range group {
			h := kh*group + g
			qH := gather(sc.get(3, Tn*hd), A.q, b*Tn, Tn, d, h*hd, hd)
			P := A.p[(b*c.Heads+h)*Tn*Tn : (b*c.Heads+h+1)*Tn*Tn]
			mm(sp, P, kH, qH, Tn, hd, Tn) // P[t][s] = q_t·k_s
			for t := range Tn {
				causalSoftmax(P[t*Tn:(t+1)*Tn], t, scale)
			}
			o := sc.get(4, Tn*hd)
			mm(sp, o, vT, P, hd, Tn, Tn) // o[t][c] = Σ_s P[t][s]·v_s[c]
			scatter(A.att, o, b*Tn, Tn, d, h*hd, hd)
		}
	})
}

// kvTasks runs fn for every (sequence, KV head) pair on the pool. Each
// task gets serial matmuls (a one-thread pool), scratch of its own whose
// slots 0 and 1 hold the head's K and V gathered into contiguous T×hd
// blocks, and owns that head's rows of every output.
func (e *Engine[T]) kvTasks(A *layerActs[T], fn func(sp *kernels.Pool, sc *scratch[T], b, kh int, kH, vH []T)) {
	c := e.cfg
	Tn, hd := e.t, c.HeadDim
	kvd := c.KVHeads * hd
	e.pool.Run(e.b*c.KVHeads, func(lo, hi int) {
		sp := kernels.NewPool(1)
		var sc scratch[T]
		for task := lo; task < hi; task++ {
			b, kh := task/c.KVHeads, task%c.KVHeads
			kH := gather(sc.get(0, Tn*hd), A.k, b*Tn, Tn, kvd, kh*hd, hd)
			vH := gather(sc.get(1, Tn*hd), A.v, b*Tn, Tn, kvd, kh*hd, hd)
			fn(sp, &sc, b, kh, kH, vH)
		}
	})
}

// causalSoftmax turns row (scores of query t against keys 0..len-1) into
// probabilities over keys 0..t, zero after.
func causalSoftmax[T Float](row []T, t int, scale T) {
	mx := row[0] * scale
	for _, v := range row[1 : t+1] {
		mx = max(mx, v*scale)
	}
	var z float64
	for s := 0; s <= t; s++ {
		ex := math.Exp(float64(row[s]*scale - mx))
		row[s] = T(ex)
		z += ex
	}
	iz := T(1 / z)
	for s := 0; s <= t; s++ {
		row[s] *= iz
	}
	clear(row[t+1:])
}

// gather copies rows r0..r0+n of src (stride) at columns off..off+w into
// dst (n×w).
func gather[T Float](dst, src []T, r0, n, stride, off, w int) []T {
	for i := range n {
		copy(dst[i*w:(i+1)*w], src[(r0+i)*stride+off:(r0+i)*stride+off+w])
	}
	return dst
}

// scatter is gather's inverse.
func scatter[T Float](dst, src []T, r0, n, stride, off, w int) {
	for i := range n {
		copy(dst[(r0+i)*stride+off:(r0+i)*stride+off+w], src[i*w:(i+1)*w])
	}
}

// rmsNorm sets out = x/rms(x)·w per row and keeps 1/rms in r.
func rmsNorm[T Float](p *kernels.Pool, out, r, x, w []T, n, d int, eps T) {
	p.Run(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*d : (i+1)*d]
			var ss T
			for _, v := range xi {
				ss += v * v
			}
			inv := T(1 / math.Sqrt(float64(ss/T(d)+eps)))
			r[i] = inv
			o := out[i*d : (i+1)*d]
			for j, v := range xi {
				o[j] = w[j] * (inv * v)
			}
		}
	})
}

// swiglu sets h = silu(g)·u.
func swiglu[T Float](p *kernels.Pool, h, g, u []T) {
	p.Run(len(h), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			h[i] = g[i] / (1 + T(math.Exp(float64(-g[i])))) * u[i]
		}
	})
}

// sum sets dst = a + b.
func sum[T Float](p *kernels.Pool, dst, a, b []T) {
	p.Run(len(dst), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst[i] = a[i] + b[i]
		}
	})
}

// firstNonFinite names the first activation of the last Forward, in
// compute order, that holds a NaN or an infinity ("" when none does).
func (e *Engine[T]) firstNonFinite() string {
	n := e.b * e.t
	c := e.cfg
	d, hid := c.Dim, c.Hidden
	if !finite(e.acts[0].xIn[:n*d]) {
		return "the token embedding (token_embd)"
	}
	for l := range e.acts {
		A := &e.acts[l]
		out := e.xOut
		if l+1 < len(e.acts) {
			out = e.acts[l+1].xIn
		}
		for _, s := range []struct {
			what string
			v    []T
		}{
			{"attention norm", A.an[:n*d]},
			{"attention (q/k/v and softmax)", A.att[:n*d]},
			{"attention output", A.xMid[:n*d]},
			{"feed-forward norm", A.fn[:n*d]},
			{"feed-forward (gate/up)", A.h[:n*hid]},
			{"feed-forward output", out[:n*d]},
		} {
			if !finite(s.v) {
				return fmt.Sprintf("layer %d (blk.%d, %s)", l, l, s.what)
			}
		}
	}
	if !finite(e.y[:n*d]) {
		return "the output norm"
	}
	if !finite(e.logits[:n*c.Vocab]) {
		return "the output head (logits)"
	}
	return ""
}

func finite[T Float](v []T) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}
