package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

func TestRMSNormRoPESoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x, w := randVec(rng, 67, 2), randVec(rng, 67, 1)
	out := make([]float32, 67)
	RMSNorm(out, x, w, 1e-5)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	scale := 1 / math.Sqrt(ss/67+1e-5)
	for i := range x {
		if d := math.Abs(float64(out[i]) - float64(x[i])*scale*float64(w[i])); d > 1e-5 {
			t.Fatalf("rmsnorm[%d] off by %g", i, d)
		}
	}

	const heads, hd, pos = 3, 10, 37
	q := randVec(rng, heads*hd, 1)
	r := append([]float32(nil), q...)
	RoPE(r, heads, hd, pos, 10000)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd; i += 2 {
			ang := pos * math.Pow(10000, -float64(i)/hd)
			a, b := float64(q[h*hd+i]), float64(q[h*hd+i+1])
			w0, w1 := a*math.Cos(ang)-b*math.Sin(ang), a*math.Sin(ang)+b*math.Cos(ang)
			if math.Abs(float64(r[h*hd+i])-w0) > 1e-4 || math.Abs(float64(r[h*hd+i+1])-w1) > 1e-4 {
				t.Fatalf("rope head %d pair %d: (%v,%v), want (%v,%v)", h, i, r[h*hd+i], r[h*hd+i+1], w0, w1)
			}
		}
	}

	s := []float32{1000, 1001, 999, -1e30}
	Softmax(s)
	e := []float64{math.Exp(-1), 1, math.Exp(-2), 0}
	sum := e[0] + e[1] + e[2]
	for i := range s {
		if math.Abs(float64(s[i])-e[i]/sum) > 1e-6 {
			t.Fatalf("softmax %v", s)
		}
	}

	g, u := []float32{-3, 0, 2}, []float32{2, 5, 0.5}
	SiLUMul(g, u)
	for i, gv := range []float64{-3, 0, 2} {
		want := gv / (1 + math.Exp(-gv)) * []float64{2, 5, 0.5}[i]
		if math.Abs(float64(g[i])-want) > 1e-6 {
			t.Fatalf("silu[%d] = %v, want %v", i, g[i], want)
		}
	}
}

// Attention over a prefix plus tree ancestors equals attention over the
// same rows gathered into a dense block, in F32 and F16.
func TestAttentionTreeRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const hd, stride, off, rows = 12, 40, 16, 9
	k, v := randVec(rng, rows*stride, 1), randVec(rng, rows*stride, 1)
	q := randVec(rng, hd, 1)
	prefix, extra := 4, []int32{6, 8}
	use := []int{0, 1, 2, 3, 6, 8}
	scale := float32(1 / math.Sqrt(hd))

	var want [hd]float64
	sc := make([]float64, len(use))
	var mx float64 = -math.MaxFloat64
	for i, r := range use {
		for d := 0; d < hd; d++ {
			sc[i] += float64(q[d]) * float64(k[r*stride+off+d])
		}
		sc[i] *= float64(scale)
		mx = max(mx, sc[i])
	}
	var sum float64
	for i := range sc {
		sc[i] = math.Exp(sc[i] - mx)
		sum += sc[i]
	}
	for i, r := range use {
		for d := 0; d < hd; d++ {
			want[d] += sc[i] / sum * float64(v[r*stride+off+d])
		}
	}
	out := make([]float32, hd)
	Attention(out, q, k, v, stride, off, prefix, extra, scale, make([]float32, 6))
	k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
	for i := range k {
		k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
	}
	out16 := make([]float32, hd)
	AttentionF16(out16, q, k16, v16, stride, off, prefix, extra, scale, make([]float32, 6))
	for d := 0; d < hd; d++ {
		if math.Abs(float64(out[d])-want[d]) > 1e-5 {
			t.Fatalf("f32 attention[%d] = %v, want %v", d, out[d], want[d])
		}
		if math.Abs(float64(out16[d])-want[d]) > 5e-3 {
			t.Fatalf("f16 attention[%d] = %v, want %v", d, out16[d], want[d])
		}
	}
}

func TestBackendSelection(t *testing.T) {
	defer SetBackend(Backends()[0])
	if err := SetBackend("go"); err != nil || Backend() != "go" {
		t.Fatal(err)
	}
	if err := SetBackend("cuda"); err == nil {
		t.Error("unknown backend accepted")
	}
}
