package train

import (
	"fmt"
	"math"

	"github.com/tandem-llm/tandem/kernels"
)

// Backward computes the gradient of the last Forward's loss with respect
// to every parameter into g, overwriting it. p must be the parameters
// that Forward ran with.
func (e *Engine[T]) Backward(p, g *Params[T]) error {
	if e.b == 0 {
		return fmt.Errorf("train: backward before forward")
	}
	if len(g.Data) != len(p.Data) {
		return fmt.Errorf("train: gradient has %d values, parameters %d", len(g.Data), len(p.Data))
	}
	c := e.cfg
	pool := e.pool
	n, d, kvd, hid, V := e.b*e.t, c.Dim, c.KVHeads*c.HeadDim, c.Hidden, c.Vocab
	sc := &e.sc

	// Head: logits = y·Outᵀ. When tied this sets the embedding's
	// gradient; the lookup's part is added at the end.
	dy := e.df
	linearGrad(pool, sc, dy, g.Out, e.dlogits, p.Out, e.y, nil, V, d, n, false)
	dx := e.dx // gradient of the residual stream, walking down the blocks
	rmsNormGrad(pool, dx, g.OutNorm, dy, e.xOut, p.OutNorm, e.rf, n, d)

	for l := c.Layers - 1; l >= 0; l-- {
		A, L, G := &e.acts[l], &p.Layers[l], &g.Layers[l]
		// out = xMid + h·Downᵀ
		linearGrad(pool, sc, e.dh, G.Down, dx, L.Down, A.h, nil, d, hid, n, false)
		swigluGrad(pool, e.dg[:n*hid], e.du[:n*hid], e.dh[:n*hid], A.g[:n*hid], A.u[:n*hid])
		transpose(pool, e.fT, A.fn[:n*d], n, d)
		linearGrad(pool, sc, e.df, G.Gate, e.dg, L.Gate, A.fn, e.fT, hid, d, n, false)
		linearGrad(pool, sc, e.df, G.Up, e.du, L.Up, A.fn, e.fT, hid, d, n, true)
		// fn = rmsnorm(xMid); xMid also flows straight to out.
		rmsNormGrad(pool, e.dxm, G.FFNNorm, e.df, A.xMid, L.FFNNorm, A.r2, n, d)
		add(pool, e.dxm[:n*d], dx[:n*d])
		// xMid = xIn + att·Woᵀ
		linearGrad(pool, sc, e.datt, G.Wo, e.dxm, L.Wo, A.att, nil, d, d, n, false)
		e.attentionGrad(A)
		e.rope(e.dq[:n*d], c.Heads, e.t, -1)
		e.rope(e.dk[:n*kvd], c.KVHeads, e.t, -1)
		transpose(pool, e.aT, A.an[:n*d], n, d)
		linearGrad(pool, sc, e.da, G.Wq, e.dq, L.Wq, A.an, e.aT, d, d, n, false)
		linearGrad(pool, sc, e.da, G.Wk, e.dk, L.Wk, A.an, e.aT, kvd, d, n, true)
		linearGrad(pool, sc, e.da, G.Wv, e.dv, L.Wv, A.an, e.aT, kvd, d, n, true)
		// an = rmsnorm(xIn); xIn also flows straight to xMid.
		rmsNormGrad(pool, dx, G.AttnNorm, e.da, A.xIn, L.AttnNorm, A.r1, n, d)
		add(pool, dx[:n*d], e.dxm[:n*d])
	}

	if !c.Tied {
		clear(g.Emb)
	}
	for i := range n {
		tok := int(e.tokens[i])
		row := g.Emb[tok*d : (tok+1)*d]
		for j, v := range dx[i*d : (i+1)*d] {
			row[j] += v
		}
	}
	return nil
}

// attentionGrad back-propagates attention: from datt it computes dq, dk
// and dv (set), with the saved probabilities. Per head, with S = q·kᵀ
// scaled and P = softmax(S):
//
//	dP = dO·vᵀ   dv = Pᵀ·dO   dS = P∘(dP − rowsum(P∘dP))·scale
//	dq = dS·k    dk = dSᵀ·q
//
// A task owns one sequence and one KV head, so the gradients of a KV
// head shared by a group of query heads are summed without races.
func (e *Engine[T]) attentionGrad(A *layerActs[T]) {
	c := e.cfg
	Tn, hd, d := e.t, c.HeadDim, c.Dim
	kvd := c.KVHeads * hd
	group := c.Heads / c.KVHeads
	scale := T(float32(1 / math.Sqrt(float64(hd))))
	e.kvTasks(A, func(sp *kernels.Pool, sc *scratch[T], b, kh int, kH, vH []T) {
		kT := sc.get(2, hd*Tn)
		transpose(nil, kT, kH, Tn, hd)
		dK, dV := sc.get(3, Tn*hd), sc.get(4, Tn*hd)
		clear(dK)
		clear(dV)
		tmp := sc.get(5, Tn*hd)
		for gi := range group {
			h := kh*group + gi
			P := A.p[(b*c.Heads+h)*Tn*Tn : (b*c.Heads+h+1)*Tn*Tn]
			dO := gather(sc.get(6, Tn*hd), e.datt, b*Tn, Tn, d, h*hd, hd)
			dOT := sc.get(7, hd*Tn)
			transpose(nil, dOT, dO, Tn, hd)
			qH := gather(sc.get(8, Tn*hd), A.q, b*Tn, Tn, d, h*hd, hd)
			qT := sc.get(9, hd*Tn)
			transpose(nil, qT, qH, Tn, hd)

			dP := sc.get(10, Tn*Tn)
			mm(sp, dP, vH, dO, Tn, hd, Tn) // dP[t][s] = dO_t·v_s
			pT := sc.get(11, Tn*Tn)
			transpose(nil, pT, P, Tn, Tn)
			mm(sp, tmp, dOT, pT, hd, Tn, Tn) // tmp[s][c] = Σ_t P[t][s]·dO[t][c]
			addTo(dV, tmp)

			dS := dP // overwritten row by row
			for t := range Tn {
				pr, gr := P[t*Tn:(t+1)*Tn], dP[t*Tn:(t+1)*Tn]
				var dotp T
				for s := 0; s <= t; s++ {
					dotp += pr[s] * gr[s]
				}
				for s := 0; s <= t; s++ {
					dS[t*Tn+s] = pr[s] * (gr[s] - dotp) * scale
				}
				clear(dS[t*Tn+t+1 : (t+1)*Tn])
			}
			dQ := sc.get(12, Tn*hd)
			mm(sp, dQ, kT, dS, hd, Tn, Tn) // dQ[t][c] = Σ_s dS[t][s]·k_s[c]
			scatter(e.dq, dQ, b*Tn, Tn, d, h*hd, hd)
			dST := pT // P's transpose is no longer needed
			transpose(nil, dST, dS, Tn, Tn)
			mm(sp, tmp, qT, dST, hd, Tn, Tn) // tmp[s][c] = Σ_t dS[t][s]·q_t[c]
			addTo(dK, tmp)
		}
		scatter(e.dk, dK, b*Tn, Tn, kvd, kh*hd, hd)
		scatter(e.dv, dV, b*Tn, Tn, kvd, kh*hd, hd)
	})
}

func addTo[T Float](dst, x []T) {
	for i, v := range x[:len(dst)] {
		dst[i] += v
	}
}

// rmsNormGrad back-propagates out = x·r·w (r = 1/rms(x)): dx is set,
// dw is set to Σ_rows dy·x·r. Per row,
//
//	dx_j = r·w_j·dy_j − r³/d · x_j · Σ_k dy_k·w_k·x_k
func rmsNormGrad[T Float](p *kernels.Pool, dx, dw, dy, x, w, r []T, n, d int) {
	p.Run(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi, gi, oi := x[i*d:(i+1)*d], dy[i*d:(i+1)*d], dx[i*d:(i+1)*d]
			ri := r[i]
			var s T
			for j, v := range xi {
				s += gi[j] * w[j] * v
			}
			k := ri * ri * ri * s / T(d)
			for j, v := range xi {
				oi[j] = ri*w[j]*gi[j] - k*v
			}
		}
	})
	// The gain's gradient sums over rows; splitting by columns keeps the
	// order of each sum fixed whatever the thread count.
	p.Run(d, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			var s T
			for i := 0; i < n; i++ {
				s += dy[i*d+j] * x[i*d+j] * r[i]
			}
			dw[j] = s
		}
	})
}

// swigluGrad back-propagates h = silu(g)·u with silu(g) = g·σ(g):
// dg = dh·u·σ(g)·(1 + g·(1 − σ(g))), du = dh·silu(g).
func swigluGrad[T Float](p *kernels.Pool, dg, du, dh, g, u []T) {
	p.Run(len(dh), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sg := 1 / (1 + T(math.Exp(float64(-g[i]))))
			du[i] = dh[i] * g[i] * sg
			dg[i] = dh[i] * u[i] * sg * (1 + g[i]*(1-sg))
		}
	})
}
