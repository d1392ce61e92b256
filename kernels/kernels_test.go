package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
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

// quantMatrix quantizes a random rows×cols matrix to wt and returns the
// bytes and the dequantized values the kernel really multiplies.
func quantMatrix(t testing.TB, rng *rand.Rand, wt weights.DType, rows, cols int) ([]byte, []float32) {
	src := randVec(rng, rows*cols, 0.5)
	rb, _ := wt.RowBytes(uint64(cols))
	w := make([]byte, int(rb)*rows)
	if err := weights.Quantize(wt, src, w); err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	if err := weights.Dequantize(wt, w, deq); err != nil {
		t.Fatal(err)
	}
	return w, deq
}

// refMatMul is the float64 reference on the dequantized weights.
func refMatMul(deq []float32, rows, cols int, x []float32, n int) []float64 {
	out := make([]float64, n*rows)
	for j := 0; j < n; j++ {
		for r := 0; r < rows; r++ {
			var s float64
			for c := 0; c < cols; c++ {
				s += float64(deq[r*cols+c]) * float64(x[j*cols+c])
			}
			out[j*rows+r] = s
		}
	}
	return out
}

var matTypes = []weights.DType{weights.F32, weights.F16, weights.BF16, weights.Q8_0, weights.Q4_0, weights.Q4_K, weights.Q6_K}

// Tolerances relative to Σ|w·x| of the row: float types only round;
// Q8_0/Q4_0 also quantize the activations to 8 bits (error ≤ 1/254 of
// each block's largest value).
var matTol = map[weights.DType]float64{
	weights.F32: 1e-6, weights.F16: 1e-6, weights.BF16: 1e-6, weights.Q4_K: 1e-6, weights.Q6_K: 1e-6,
	weights.Q8_0: 8e-3, weights.Q4_0: 8e-3,
}

func TestMatMulMatchesReference(t *testing.T) {
	pool := NewPool(3)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, be := range Backends() {
		for _, wt := range matTypes {
			for _, rows := range []int{1, 3, 17, 67} {
				for _, n := range []int{1, 2, 3, 5, 8} {
					cols := 3 * wt.BlockSize() // not a multiple of 2 blocks
					if wt.BlockSize() == 1 {
						cols = 97 // awkward for every SIMD width
					}
					name := fmt.Sprintf("%s/%s/%dx%d/n=%d", be, wt, rows, cols, n)
					t.Run(name, func(t *testing.T) {
						if err := SetBackend(be); err != nil {
							t.Fatal(err)
						}
						defer SetBackend(Backends()[0])
						w, deq := quantMatrix(t, rng, wt, rows, cols)
						x := randVec(rng, n*cols, 1)
						out := make([]float32, n*rows)
						if err := pool.MatMul(out, w, wt, rows, cols, x, n); err != nil {
							t.Fatal(err)
						}
						ref := refMatMul(deq, rows, cols, x, n)
						for j := 0; j < n; j++ {
							for r := 0; r < rows; r++ {
								var mag float64
								for c := 0; c < cols; c++ {
									mag += math.Abs(float64(deq[r*cols+c]) * float64(x[j*cols+c]))
								}
								got, want := float64(out[j*rows+r]), ref[j*rows+r]
								if d := math.Abs(got - want); !(d <= matTol[wt]*mag+1e-6) {
									t.Fatalf("vector %d row %d: %v, reference %v (|diff| %.3g > %.1g·%.3g)", j, r, got, want, d, matTol[wt], mag)
								}
							}
						}
					})
				}
			}
		}
	}
}

// Every backend and thread count gives the same bits as the Go twin on
// one thread: the work split never changes the arithmetic.
func TestMatMulDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, wt := range matTypes {
		rows, cols, n := 37, 2*weights.QKK, 3
		w, _ := quantMatrix(t, rng, wt, rows, cols)
		x := randVec(rng, n*cols, 1)
		var first []float32
		for _, threads := range []int{1, 2, 3} {
			pool := NewPool(threads)
			out := make([]float32, n*rows)
			if err := pool.MatMul(out, w, wt, rows, cols, x, n); err != nil {
				t.Fatal(err)
			}
			pool.Close()
			if first == nil {
				first = out
				continue
			}
			for i := range out {
				if out[i] != first[i] {
					t.Fatalf("%s: %d threads: out[%d] = %v, 1 thread %v", wt, threads, i, out[i], first[i])
				}
			}
		}
	}
}

func TestMatMulRejects(t *testing.T) {
	pool := NewPool(1)
	defer pool.Close()
	out, x := make([]float32, 8), make([]float32, 64)
	w := make([]byte, 4*64*4)
	for _, tc := range []struct {
		name          string
		wt            weights.DType
		rows, cols, n int
		w             []byte
		want          string
	}{
		{"type", weights.Q4_1, 2, 32, 1, w, "no kernel"},
		{"block", weights.Q4_0, 2, 33, 1, w, "multiple"},
		{"short weights", weights.F32, 8, 64, 1, w[:100], "weights hold 100 bytes"},
		{"short x", weights.F32, 2, 64, 2, w, "activations"},
		{"short out", weights.F32, 8, 32, 2, w, "output holds"},
		{"zero", weights.F32, 0, 32, 1, w, "positive"},
	} {
		err := pool.MatMul(out, tc.w, tc.wt, tc.rows, tc.cols, x, tc.n)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
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

func BenchmarkMatMul(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, wt := range []weights.DType{weights.Q4_0, weights.Q8_0, weights.F16, weights.Q4_K, weights.Q6_K} {
		for _, shape := range [][2]int{{2048, 5632}, {5632, 2048}} {
			rows, cols := shape[0], shape[1]
			w, _ := quantMatrix(b, rng, wt, rows, cols)
			for _, threads := range []int{1, 2} {
				for _, n := range []int{1, 8} {
					x := randVec(rng, n*cols, 1)
					out := make([]float32, n*rows)
					pool := NewPool(threads)
					b.Run(fmt.Sprintf("%s/%s/%dx%d/t=%d/n=%d", Backend(), wt, rows, cols, threads, n), func(b *testing.B) {
						b.SetBytes(int64(len(w)))
						for b.Loop() {
							pool.MatMul(out, w, wt, rows, cols, x, n)
						}
					})
					pool.Close()
				}
			}
		}
	}
}
