package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// MLP is a small regressor: standardized inputs, tanh hidden layers, one
// linear output predicting log1p(output tokens), standardized. Output
// lengths are skewed (a few very long answers), so fitting their log
// keeps the long tail from dominating the loss.
type MLP struct {
	Layers  []Dense   `json:"layers"`
	InMean  []float64 `json:"in_mean"`
	InStd   []float64 `json:"in_std"`
	OutMean float64   `json:"out_mean"`
	OutStd  float64   `json:"out_std"`
}

// Dense is one layer: out = W·in + B, W row-major (one row per output).
type Dense struct {
	W [][]float64 `json:"w"`
	B []float64   `json:"b"`
}

// Inputs is the input width.
func (m *MLP) Inputs() int {
	if len(m.Layers) == 0 || len(m.Layers[0].W) == 0 {
		return 0
	}
	return len(m.Layers[0].W[0])
}

// Validate checks shapes and values, so a damaged calibration file is
// refused with a clear error instead of predicting garbage.
func (m *MLP) Validate() error {
	if len(m.Layers) == 0 {
		return errors.New("mlp: no layers")
	}
	in := m.Inputs()
	if in == 0 || len(m.InMean) != in || len(m.InStd) != in {
		return fmt.Errorf("mlp: %d inputs but %d means and %d deviations", in, len(m.InMean), len(m.InStd))
	}
	if in > maxWidth || len(m.Layers) > 8 {
		return fmt.Errorf("mlp: %d inputs and %d layers; at most %d and 8", in, len(m.Layers), maxWidth)
	}
	width := in
	for li, l := range m.Layers {
		if len(l.W) > maxWidth {
			return fmt.Errorf("mlp: layer %d has %d outputs, at most %d", li, len(l.W), maxWidth)
		}
		if len(l.W) == 0 || len(l.B) != len(l.W) {
			return fmt.Errorf("mlp: layer %d has %d rows and %d biases", li, len(l.W), len(l.B))
		}
		for r, row := range l.W {
			if len(row) != width {
				return fmt.Errorf("mlp: layer %d row %d has %d weights, want %d", li, r, len(row), width)
			}
			for _, w := range row {
				if !finite(w) {
					return fmt.Errorf("mlp: layer %d row %d has a non-finite weight", li, r)
				}
			}
		}
		for _, b := range l.B {
			if !finite(b) {
				return fmt.Errorf("mlp: layer %d has a non-finite bias", li)
			}
		}
		width = len(l.W)
	}
	if width != 1 {
		return fmt.Errorf("mlp: output width %d, want 1", width)
	}
	for i, s := range m.InStd {
		if !(s > 0) || !finite(m.InMean[i]) || !finite(s) {
			return fmt.Errorf("mlp: input %d has mean %v and deviation %v", i, m.InMean[i], s)
		}
	}
	if !(m.OutStd > 0) || !finite(m.OutStd) || !finite(m.OutMean) {
		return fmt.Errorf("mlp: output mean %v and deviation %v", m.OutMean, m.OutStd)
	}
	return nil
}

// maxWidth bounds every layer, so Predict runs on the stack.
const maxWidth = 32

// Predict returns the predicted output length in tokens (>= 0).
func (m *MLP) Predict(x []float64) float64 {
	var buf [2][maxWidth]float64
	cur := buf[0][:0]
	for i, v := range x {
		cur = append(cur, (v-m.InMean[i])/m.InStd[i])
	}
	for li, l := range m.Layers {
		next := buf[(li+1)%2][:0]
		for r, row := range l.W {
			s := l.B[r]
			for c, w := range row {
				s += w * cur[c]
			}
			if li < len(m.Layers)-1 {
				s = math.Tanh(s)
			}
			next = append(next, s)
		}
		cur = next
	}
	y := cur[0]*m.OutStd + m.OutMean
	return math.Max(0, math.Expm1(math.Min(y, 30)))
}

// TrainOptions configures TrainMLP.
type TrainOptions struct {
	Hidden      []int   // hidden layer widths (default 16, 8); at most 32 each
	Epochs      int     // full-batch Adam steps (default 1500)
	LearnRate   float64 // Adam step size (default 0.01)
	WeightDecay float64 // L2 penalty (default 1e-4)
	Seed        uint64
}

// TrainMLP fits an MLP to inputs xs and output lengths ys (tokens) by
// full-batch Adam on the squared error of standardized log1p(ys).
func TrainMLP(xs [][]float64, ys []float64, opt TrainOptions) (*MLP, error) {
	return TrainMLPContext(context.Background(), xs, ys, opt)
}

// TrainMLPContext is TrainMLP that stops with ctx's error once ctx is
// done: many samples or epochs train for minutes.
func TrainMLPContext(ctx context.Context, xs [][]float64, ys []float64, opt TrainOptions) (*MLP, error) {
	if len(xs) == 0 || len(xs) != len(ys) {
		return nil, fmt.Errorf("mlp: train: %d inputs and %d targets; want the same positive number", len(xs), len(ys))
	}
	in := len(xs[0])
	for i, x := range xs {
		if len(x) != in {
			return nil, fmt.Errorf("mlp: train: sample %d has %d inputs, want %d", i, len(x), in)
		}
		if ys[i] < 0 || !finite(ys[i]) {
			return nil, fmt.Errorf("mlp: train: sample %d has target %v; lengths are >= 0", i, ys[i])
		}
	}
	if len(opt.Hidden) == 0 {
		opt.Hidden = []int{16, 8}
	}
	for _, h := range opt.Hidden {
		if h <= 0 || h > maxWidth {
			return nil, fmt.Errorf("mlp: train: hidden width %d outside 1..%d", h, maxWidth)
		}
	}
	if opt.Epochs <= 0 {
		opt.Epochs = 1500
	}
	// Written so that NaN takes the default too (NaN trained NaN weights).
	if !(opt.LearnRate > 0) || math.IsInf(opt.LearnRate, 1) {
		opt.LearnRate = 0.01
	}
	if !(opt.WeightDecay >= 0) || math.IsInf(opt.WeightDecay, 1) {
		opt.WeightDecay = 0
	} else if opt.WeightDecay == 0 {
		opt.WeightDecay = 1e-4
	}

	m := &MLP{InMean: make([]float64, in), InStd: make([]float64, in)}
	for c := 0; c < in; c++ {
		col := make([]float64, len(xs))
		for i := range xs {
			col[i] = xs[i][c]
		}
		m.InMean[c], m.InStd[c] = meanStd(col)
	}
	ty := make([]float64, len(ys))
	for i, y := range ys {
		ty[i] = math.Log1p(y)
	}
	m.OutMean, m.OutStd = meanStd(ty)
	for i := range ty {
		ty[i] = (ty[i] - m.OutMean) / m.OutStd
	}
	nx := make([][]float64, len(xs))
	for i, x := range xs {
		nx[i] = make([]float64, in)
		for c, v := range x {
			nx[i][c] = (v - m.InMean[c]) / m.InStd[c]
		}
	}

	rng := rand.New(rand.NewPCG(opt.Seed, opt.Seed^0x5851f42d4c957f2d))
	widths := append(append([]int{in}, opt.Hidden...), 1)
	for li := 1; li < len(widths); li++ {
		fanIn, fanOut := widths[li-1], widths[li]
		lim := math.Sqrt(6 / float64(fanIn+fanOut)) // Glorot uniform
		d := Dense{W: make([][]float64, fanOut), B: make([]float64, fanOut)}
		for r := range d.W {
			d.W[r] = make([]float64, fanIn)
			for c := range d.W[r] {
				d.W[r][c] = (rng.Float64()*2 - 1) * lim
			}
		}
		m.Layers = append(m.Layers, d)
	}
	if err := adamFit(ctx, m, nx, ty, opt); err != nil {
		return nil, err
	}
	return m, m.Validate()
}

func meanStd(v []float64) (mean, std float64) {
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	for _, x := range v {
		std += (x - mean) * (x - mean)
	}
	std = math.Sqrt(std / float64(len(v)))
	if std < 1e-9 {
		std = 1 // a constant input carries no information; keep it harmless
	}
	return mean, std
}

// adamFit runs full-batch Adam with backpropagation through the tanh
// layers on standardized inputs nx and targets ty, until ctx is done.
func adamFit(ctx context.Context, m *MLP, nx [][]float64, ty []float64, opt TrainOptions) error {
	L := len(m.Layers)
	type moments struct {
		mw, vw [][]float64
		mb, vb []float64
	}
	grads := make([]Dense, L)
	mom := make([]moments, L)
	for li, l := range m.Layers {
		grads[li] = zeroLike(l)
		z := zeroLike(l)
		z2 := zeroLike(l)
		mom[li] = moments{mw: z.W, vw: z2.W, mb: z.B, vb: z2.B}
	}
	acts := make([][]float64, L+1) // activations per layer for one sample
	delta := make([][]float64, L)
	for li, l := range m.Layers {
		acts[li+1] = make([]float64, len(l.W))
		delta[li] = make([]float64, len(l.W))
	}
	const b1, b2, eps = 0.9, 0.999, 1e-8
	n := float64(len(nx))
	for step := 1; step <= opt.Epochs; step++ {
		if step%16 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		for li := range grads {
			clearDense(grads[li])
		}
		for i, x := range nx {
			acts[0] = x
			for li, l := range m.Layers {
				for r, row := range l.W {
					s := l.B[r]
					for c, w := range row {
						s += w * acts[li][c]
					}
					if li < L-1 {
						s = math.Tanh(s)
					}
					acts[li+1][r] = s
				}
			}
			delta[L-1][0] = 2 * (acts[L][0] - ty[i]) / n
			for li := L - 1; li >= 0; li-- {
				l := m.Layers[li]
				for r, row := range l.W {
					d := delta[li][r]
					grads[li].B[r] += d
					for c := range row {
						grads[li].W[r][c] += d * acts[li][c]
					}
				}
				if li == 0 {
					break
				}
				for c := range acts[li] {
					s := 0.0
					for r, row := range l.W {
						s += row[c] * delta[li][r]
					}
					a := acts[li][c]
					delta[li-1][c] = s * (1 - a*a) // tanh'
				}
			}
		}
		c1 := 1 - math.Pow(b1, float64(step))
		c2 := 1 - math.Pow(b2, float64(step))
		upd := func(p, g, mm, vv *float64, decay float64) {
			gr := *g + decay**p
			*mm = b1**mm + (1-b1)*gr
			*vv = b2**vv + (1-b2)*gr*gr
			*p -= opt.LearnRate * (*mm / c1) / (math.Sqrt(*vv/c2) + eps)
		}
		for li := range m.Layers {
			l, g, mo := m.Layers[li], grads[li], mom[li]
			for r := range l.W {
				for c := range l.W[r] {
					upd(&l.W[r][c], &g.W[r][c], &mo.mw[r][c], &mo.vw[r][c], opt.WeightDecay)
				}
				upd(&l.B[r], &g.B[r], &mo.mb[r], &mo.vb[r], 0)
			}
		}
	}
	return nil
}

func zeroLike(l Dense) Dense {
	d := Dense{W: make([][]float64, len(l.W)), B: make([]float64, len(l.B))}
	for r := range l.W {
		d.W[r] = make([]float64, len(l.W[r]))
	}
	return d
}

func clearDense(d Dense) {
	for r := range d.W {
		clear(d.W[r])
	}
	clear(d.B)
}
