package kernels

import (
	"fmt"
	"math"
)

// RMSNorm sets out = x / sqrt(mean(x²) + eps) · weight. out may alias x.
func RMSNorm(out, x, weight []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	scale := 1 / float32(math.Sqrt(float64(ss/float32(len(x))+eps)))
	for i, v := range x {
		out[i] = weight[i] * (scale * v)
	}
}

// RoPE rotates, in place, nHeads heads of headDim values at position pos.
// Pairs are adjacent, (x[2i], x[2i+1]), with angle pos·theta^(-2i/headDim):
// the layout of llama2.c and of llama-architecture GGUF files. A forward
// pass rotates every layer's queries and keys at the same positions, so
// it computes the angles once (RoPEAngles) and rotates with RoPERotate.
func RoPE(x []float32, nHeads, headDim, pos int, theta float32) {
	cos, sin := make([]float32, headDim/2), make([]float32, headDim/2)
	RoPEAngles(cos, sin, headDim, pos, theta)
	RoPERotate(x, nHeads, headDim, cos, sin)
}

// RoPEAngles sets cos[i] and sin[i] to the cosine and sine of pair i's
// angle at position pos, for the headDim/2 pairs of a head.
func RoPEAngles(cos, sin []float32, headDim, pos int, theta float32) {
	for i := range headDim / 2 {
		// float32 steps, as llama2.c computes them: positions far into
		// the context then rotate exactly as in the reference.
		freq := 1 / float32(math.Pow(float64(theta), float64(float32(2*i)/float32(headDim))))
		s, c := math.Sincos(float64(float32(pos) * freq))
		cos[i], sin[i] = float32(c), float32(s)
	}
}

// RoPERotate rotates, in place, nHeads heads of headDim values by the
// angles RoPEAngles gave for their position.
func RoPERotate(x []float32, nHeads, headDim int, cos, sin []float32) {
	cos, sin = cos[:headDim/2], sin[:headDim/2]
	for h := range nHeads {
		v := x[h*headDim : (h+1)*headDim]
		for i := range cos {
			c, s := cos[i], sin[i]
			v0, v1 := v[2*i], v[2*i+1]
			v[2*i] = v0*c - v1*s
			v[2*i+1] = v0*s + v1*c
		}
	}
}

// Softmax normalises x in place, subtracting the maximum first so large
// logits do not overflow.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		m = max(m, v)
	}
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] *= inv
	}
}

// ExpSum sets x[i] = e^(x[i] − m) and returns the sum of the results in
// float64: a softmax's exponentials, which over a vocabulary of tens of
// thousands of tokens cost a sampler more than the rest of its work.
// With m the maximum each result is in [0, 1]; the C kernels are within
// 2 ULP of e^x, and flush results below float32's smallest normal to 0.
// An element's result depends only on it, not on x's length.
func ExpSum(x []float32, m float32) float64 {
	if len(x) == 0 {
		return 0
	}
	return backend.expSum(x, m)
}

// goExpSum is ExpSum's pure-Go twin.
func goExpSum(x []float32, m float32) float64 {
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		sum += float64(e)
	}
	return sum
}

// SiLUMul sets gate[i] = silu(gate[i]) · up[i], the SwiGLU activation.
// Each element's result depends only on it, whatever the length, so a
// token's activations do not depend on its batch.
func SiLUMul(gate, up []float32) {
	if len(up) < len(gate) {
		panic(fmt.Sprintf("kernels: SiLUMul: %d up values for %d gates", len(up), len(gate)))
	}
	if len(gate) == 0 {
		return
	}
	backend.siluMul(gate, up[:len(gate)])
}

// goSiLUMul is SiLUMul's pure-Go twin.
func goSiLUMul(gate, up []float32) {
	for i, g := range gate {
		gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}

// Add adds x into dst (the residual connection).
func Add(dst, x []float32) {
	for i, v := range x {
		dst[i] += v
	}
}
