package train

import (
	"math"

	"github.com/tandem-llm/tandem/kernels"
)

// Schedule is the learning rate over steps: linear warmup from 0 to Peak
// over Warmup steps, then cosine decay to Min at Steps.
type Schedule struct {
	Peak, Min     float64
	Warmup, Steps int
}

// At returns the learning rate of step (0-based).
func (s Schedule) At(step int) float64 {
	if step < s.Warmup {
		return s.Peak * float64(step+1) / float64(s.Warmup)
	}
	if s.Steps <= s.Warmup || step >= s.Steps {
		return s.Min
	}
	frac := float64(step-s.Warmup) / float64(s.Steps-s.Warmup)
	return s.Min + (s.Peak-s.Min)*0.5*(1+math.Cos(math.Pi*frac))
}

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter), the
// optimizer of LLaMA and most small-transformer recipes.
type AdamW struct {
	Beta1, Beta2, Eps float64
	WeightDecay       float64 // applied to tensors whose Decay is set
	M, V              []float32
	T                 int // updates done (for bias correction)
}

// NewAdamW makes an optimizer for n parameters with the usual settings
// for small language models (β₂ 0.95 as in LLaMA, decay 0.1).
func NewAdamW(n int) *AdamW {
	return &AdamW{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, M: make([]float32, n), V: make([]float32, n)}
}

// Step applies one update with learning rate lr to p, using gradient g
// scaled by gscale (gradient clipping).
func (o *AdamW) Step(pool *kernels.Pool, p, g *Params[float32], lr, gscale float64) {
	o.T++
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	c1 := float32(1 - math.Pow(o.Beta1, float64(o.T)))
	c2 := float32(1 - math.Pow(o.Beta2, float64(o.T)))
	eps, flr, gs := float32(o.Eps), float32(lr), float32(gscale)
	off := 0
	for ti := range p.Tensors {
		t := &p.Tensors[ti]
		n := len(t.Data)
		lo0 := off
		off += n
		decay := float32(0)
		if t.Decay {
			decay = float32(o.WeightDecay)
		}
		pool.Run(n, func(lo, hi int) {
			w, gr := p.Data[lo0+lo:lo0+hi], g.Data[lo0+lo:lo0+hi]
			m, v := o.M[lo0+lo:lo0+hi], o.V[lo0+lo:lo0+hi]
			for i := range w {
				gi := gr[i] * gs
				m[i] = b1*m[i] + (1-b1)*gi
				v[i] = b2*v[i] + (1-b2)*gi*gi
				mh := m[i] / c1
				vh := v[i] / c2
				w[i] -= flr * (mh/(float32(math.Sqrt(float64(vh)))+eps) + decay*w[i])
			}
		})
	}
}

// normBlock is the fixed summation block of gradNorm: blocks are summed
// in parallel, their sums in order, so the norm (and hence clipping) is
// the same for any thread count.
const normBlock = 4096

// gradNorm returns the L2 norm of g.
func gradNorm(pool *kernels.Pool, g []float32) float64 {
	nb := (len(g) + normBlock - 1) / normBlock
	sums := make([]float64, nb)
	pool.Run(nb, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			var s float64
			for _, v := range g[b*normBlock : min((b+1)*normBlock, len(g))] {
				s += float64(v) * float64(v)
			}
			sums[b] = s
		}
	})
	var s float64
	for _, v := range sums {
		s += v
	}
	return math.Sqrt(s)
}
