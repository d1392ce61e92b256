package train

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
)

func microConfig(tied bool, kvHeads int) model.Config {
	return model.Config{Dim: 8, Hidden: 12, Layers: 2, Heads: 4, KVHeads: kvHeads, Vocab: 11, Context: 8,
		Eps: 1e-5, RopeTheta: 10000, Tied: tied}
}

// randomize gives every parameter a value far from the trained-model
// regime (large weights, gains away from 1), so every nonlinearity is
// exercised by the gradient check.
func randomize[T Float](p *Params[T], seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, t := range p.Tensors {
		for i := range t.Data {
			if len(t.Shape) == 1 {
				t.Data[i] = T(1 + 0.3*rng.NormFloat64())
			} else {
				t.Data[i] = T(0.5 * rng.NormFloat64())
			}
		}
	}
}

// randomBatch makes b sequences of t random tokens; mask drops every
// third target, soft adds random teacher distributions.
func randomBatch(c model.Config, b, t int, seed uint64, mask, soft bool) *Batch {
	rng := rand.New(rand.NewPCG(seed, 2))
	bt := &Batch{B: b, T: t, Tokens: make([]int32, b*t), Targets: make([]int32, b*t)}
	for i := range bt.Tokens {
		bt.Tokens[i] = int32(rng.IntN(c.Vocab))
		bt.Targets[i] = int32(rng.IntN(c.Vocab))
		if mask && i%3 == 1 {
			bt.Targets[i] = -1
		}
	}
	if soft {
		bt.Soft = make([]float32, b*t*c.Vocab)
		for i := 0; i < b*t; i++ {
			row := bt.Soft[i*c.Vocab : (i+1)*c.Vocab]
			var z float64
			for j := range row {
				row[j] = float32(math.Exp(2 * rng.NormFloat64()))
				z += float64(row[j])
			}
			for j := range row {
				row[j] = float32(float64(row[j]) / z)
			}
		}
	}
	return bt
}

// TestGradientsMatchFiniteDifferences checks the hand-written backward
// pass of every block against central differences of the float64 loss,
// for every parameter of a micro model: embedding, both RMSNorms, the
// attention projections (through RoPE, causal softmax and grouped-query
// heads), the SwiGLU feed-forward, the final norm, the head tied and
// untied, with cross-entropy and with KL to soft targets. In float64 the
// difference quotient is accurate to about 1e-9 relative, so the stated
// tolerance of 1e-6 (of the tensor's largest gradient) catches any wrong
// term.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	cases := []struct {
		name       string
		tied       bool
		kv         int
		mask, soft bool
	}{
		{"tied head, grouped-query, cross-entropy", true, 2, false, false},
		{"untied head, multi-head, cross-entropy with masked targets", false, 4, true, false},
		{"tied head, multi-query, KL to soft targets", true, 1, false, true},
		{"untied head, grouped-query, KL with masked targets", false, 2, true, true},
	}
	// One thread: thousands of tiny forwards, where handing work to other
	// goroutines costs more than it saves (the thread-count tests below
	// cover the parallel paths).
	pool := kernels.NewPool(1)
	defer pool.Close()
	const h, tol = 1e-5, 1e-6
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := microConfig(tc.tied, tc.kv)
			p, err := NewParams[float64](c)
			if err != nil {
				t.Fatal(err)
			}
			randomize(p, uint64(ci))
			g, _ := NewParams[float64](c)
			e, err := NewEngine[float64](c, pool)
			if err != nil {
				t.Fatal(err)
			}
			b := randomBatch(c, 2, 6, uint64(ci), tc.mask, tc.soft)
			if _, err := e.Forward(p, b); err != nil {
				t.Fatal(err)
			}
			if err := e.Backward(p, g); err != nil {
				t.Fatal(err)
			}
			stride := 1
			if testing.Short() {
				stride = 3 // qemu runs the short suite: check a third of the entries
			}
			for ti, tn := range p.Tensors {
				ana := g.Tensors[ti].Data
				var worst, scale float64
				for i := 0; i < len(tn.Data); i += stride {
					v := tn.Data[i]
					tn.Data[i] = v + h
					lp, _ := e.Forward(p, b)
					tn.Data[i] = v - h
					lm, _ := e.Forward(p, b)
					tn.Data[i] = v
					num := (lp - lm) / (2 * h)
					worst = max(worst, math.Abs(num-ana[i]))
					scale = max(scale, math.Abs(ana[i]))
				}
				if scale == 0 {
					t.Errorf("%s: gradient is all zero", tn.Name)
					continue
				}
				if worst/scale > tol {
					t.Errorf("%s: max |finite difference − backward| = %.3g, %.3g of the largest gradient %.3g (tolerance %g)",
						tn.Name, worst, worst/scale, scale, tol)
				}
			}
		})
	}
}

// TestFloat32GradientsMatchFloat64 holds the float32 path (the kernels'
// matmul, as training runs) against the float64 one checked above. The
// two differ only by float32 rounding: the tolerance, 1e-4 of the
// gradient's norm, is about 100 float32 ulps of accumulated error.
func TestFloat32GradientsMatchFloat64(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, tied := range []bool{true, false} {
		c := microConfig(tied, 2)
		c.Dim, c.Hidden, c.Heads = 16, 40, 4
		p64, _ := NewParams[float64](c)
		randomize(p64, 9)
		p32, _ := NewParams[float32](c)
		for i, v := range p64.Data {
			p32.Data[i] = float32(v)
			p64.Data[i] = float64(p32.Data[i]) // same starting values exactly
		}
		b := randomBatch(c, 3, 8, 4, true, false)
		g64, _ := NewParams[float64](c)
		g32, _ := NewParams[float32](c)
		e64, _ := NewEngine[float64](c, pool)
		e32, _ := NewEngine[float32](c, pool)
		l64, err := e64.Forward(p64, b)
		if err != nil {
			t.Fatal(err)
		}
		l32, err := e32.Forward(p32, b)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(l64-l32) > 1e-5*math.Abs(l64) {
			t.Errorf("tied=%v: loss float32 %v, float64 %v", tied, l32, l64)
		}
		e64.Backward(p64, g64)
		e32.Backward(p32, g32)
		for ti := range g64.Tensors {
			var diff, norm float64
			for i, v := range g64.Tensors[ti].Data {
				d := v - float64(g32.Tensors[ti].Data[i])
				diff += d * d
				norm += v * v
			}
			if math.Sqrt(diff) > 1e-4*math.Sqrt(norm) {
				t.Errorf("tied=%v: %s: float32 gradient differs by %.3g of its norm", tied, g64.Tensors[ti].Name, math.Sqrt(diff/norm))
			}
		}
	}
}

// TestGradientsIndependentOfThreads: every reduction has a fixed order,
// so one thread and three give bit-identical gradients (which is what
// makes a seeded run reproducible on any machine with the same kernels).
func TestGradientsIndependentOfThreads(t *testing.T) {
	c := microConfig(true, 2)
	c.Dim, c.Hidden = 32, 64
	p, _ := NewParams[float32](c)
	randomize(p, 3)
	b := randomBatch(c, 4, 8, 5, false, true)
	var grads [][]float32
	var losses []float64
	for _, threads := range []int{1, 3} {
		pool := kernels.NewPool(threads)
		e, _ := NewEngine[float32](c, pool)
		g, _ := NewParams[float32](c)
		l, err := e.Forward(p, b)
		if err != nil {
			t.Fatal(err)
		}
		e.Backward(p, g)
		pool.Close()
		grads = append(grads, g.Data)
		losses = append(losses, l)
	}
	if losses[0] != losses[1] {
		t.Errorf("loss with 1 thread %v, with 3 %v", losses[0], losses[1])
	}
	for i := range grads[0] {
		if grads[0][i] != grads[1][i] {
			t.Fatalf("gradient %d: 1 thread %v, 3 threads %v", i, grads[0][i], grads[1][i])
		}
	}
}
