package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

var matmulTypes = []weights.DType{weights.F32, weights.F16, weights.BF16, weights.Q8_0, weights.Q4_0, weights.Q4_K, weights.Q6_K}

// colsFor gives awkward row lengths that are block multiples for wt.
func colsFor(wt weights.DType) []int {
	switch wt.BlockSize() {
	case weights.QKK:
		return []int{256, 768}
	case weights.QK:
		return []int{32, 96, 288, 544}
	}
	return []int{1, 7, 96, 257}
}

// randomMatrix returns rows×cols weights encoded as wt and their exact
// decoded values (the reference dequantizer's output).
func randomMatrix(t testing.TB, rng *rand.Rand, wt weights.DType, rows, cols int) ([]byte, []float32) {
	t.Helper()
	src := make([]float32, rows*cols)
	for i := range src {
		src[i] = float32(rng.NormFloat64()) * 0.5
	}
	// A few large outliers stress the per-block scales.
	for i := 0; i < len(src)/50; i++ {
		src[rng.IntN(len(src))] *= 8
	}
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		t.Fatal(err)
	}
	w := make([]byte, int(rb)*rows)
	if err := weights.Quantize(wt, src, w); err != nil {
		t.Fatalf("quantize %s: %v", wt, err)
	}
	deq := make([]float32, rows*cols)
	if err := weights.Dequantize(wt, w, deq); err != nil {
		t.Fatalf("dequantize %s: %v", wt, err)
	}
	return w, deq
}

func randomVector(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// matmulBound returns the float64 reference out[j*rows+r] on the decoded
// weights, and per output the error a correct kernel may make: float32
// rounding (relative to Σ|w·x|) plus, for weight types that quantize the
// activations, Σ|w|·scale/2 over each activation block (the rounding
// error of every quantized activation is at most half its block's scale).
// mag is Σ|w·x|, the scale of float32 rounding differences.
func matmulBound(wt weights.DType, deq []float32, rows, cols int, x []float32, n int) (ref, tol, mag []float64) {
	ref = make([]float64, n*rows)
	tol = make([]float64, n*rows)
	mag = make([]float64, n*rows)
	blk := activationBlock(wt)
	for j := 0; j < n; j++ {
		xj := x[j*cols : (j+1)*cols]
		var scales []float64
		if blk > 0 {
			for b := 0; b < cols/blk; b++ {
				var amax float64
				for _, v := range xj[b*blk : (b+1)*blk] {
					amax = max(amax, math.Abs(float64(v)))
				}
				scales = append(scales, amax/127)
			}
		}
		for r := 0; r < rows; r++ {
			var s, abs, qerr float64
			for c := 0; c < cols; c++ {
				w := float64(deq[r*cols+c])
				s += w * float64(xj[c])
				abs += math.Abs(w * float64(xj[c]))
				if blk > 0 {
					qerr += math.Abs(w) * scales[c/blk] / 2
				}
			}
			ref[j*rows+r] = s
			tol[j*rows+r] = 1e-5*abs + 1.0001*qerr + 1e-30
			mag[j*rows+r] = abs
		}
	}
	return ref, tol, mag
}

// withBackend runs fn with backend name (see testBackends) active.
func withBackend(t *testing.T, name string, fn func()) {
	t.Helper()
	defer useBackend(t, name)()
	fn()
}

// exactTypes are the weight types whose C kernels take the Go twin's
// float steps after exact integer sums, so all backends agree bit for bit.
var exactTypes = map[weights.DType]bool{weights.Q4_K: true, weights.Q6_K: true}

func TestMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := NewPool(2)
	defer pool.Close()
	for _, wt := range matmulTypes {
		for _, cols := range colsFor(wt) {
			for _, rows := range []int{1, 3, 17, 67} {
				w, deq := randomMatrix(t, rng, wt, rows, cols)
				for _, n := range []int{1, 2, 3, 5, 8} {
					t.Run(fmt.Sprintf("%s/%dx%d/n=%d", wt, rows, cols, n), func(t *testing.T) {
						x := randomVector(rng, n*cols)
						ref, tol, mag := matmulBound(wt, deq, rows, cols, x, n)
						var goOut []float32
						for _, be := range testBackends() {
							withBackend(t, be, func() {
								out := make([]float32, n*rows+1)
								out[n*rows] = 42 // sentinel: must stay untouched
								if err := pool.MatMul(out, w, wt, rows, cols, x, n); err != nil {
									t.Fatal(err)
								}
								if out[n*rows] != 42 {
									t.Fatalf("%s: wrote past n*rows", be)
								}
								for i, v := range out[:n*rows] {
									if d := math.Abs(float64(v) - ref[i]); !(d <= tol[i]) {
										t.Fatalf("%s: out[%d] = %g, float64 reference %g: error %g > %g", be, i, v, ref[i], d, tol[i])
									}
								}
								if goOut == nil {
									goOut = out[:n*rows]
									return
								}
								// Backends agree far more closely than
								// with the reference: they multiply the
								// same integers (or floats) and differ
								// only in float32 summation order.
								for i, g := range goOut {
									c := out[i]
									if exactTypes[wt] && math.Float32bits(c) != math.Float32bits(g) {
										t.Fatalf("%s: out[%d] = %g, go %g: not bit-identical", be, i, c, g)
									}
									if d := math.Abs(float64(c) - float64(g)); d > 1e-6*mag[i]+1e-30 {
										t.Fatalf("%s: out[%d] = %g, go %g: differ by %g > 1e-6·Σ|w·x| (%g)", be, i, c, g, d, mag[i])
									}
								}
							})
						}
					})
				}
			}
		}
	}
}

// TestMatMulThreads: the row split must not change any result bit. A
// pool times each worker count a few times before it settles on one for
// a size, so repeated calls run every count.
// TestMatMulThreads: the thread count changes how rows are split, not an
// output's bits, for a matrix split evenly and for one large enough that
// the workers claim chunks (runClaimed).
func TestMatMulThreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, wt := range matmulTypes {
		cols := colsFor(wt)
		big := cols[len(cols)-1]
		if claimsFor(float64(261*big*32), 3) < 2 {
			t.Fatalf("%s: 261×%d times 32 vectors is too small for three threads to claim chunks", wt, big)
		}
		testMatMulThreads(t, rng, wt, 67, cols[1], 3)
		testMatMulThreads(t, rng, wt, 261, big, 32)
	}
}

func testMatMulThreads(t *testing.T, rng *rand.Rand, wt weights.DType, rows, cols, n int) {
	w, _ := randomMatrix(t, rng, wt, rows, cols)
	x := randomVector(rng, n*cols)
	for _, be := range testBackends() {
		withBackend(t, be, func() {
			var first []float32
			for _, threads := range []int{1, 2, 3} {
				pool := NewPool(threads)
				for call := range warmTries * len(pool.tune.options) {
					out := make([]float32, n*rows)
					if err := pool.MatMul(out, w, wt, rows, cols, x, n); err != nil {
						t.Fatal(err)
					}
					if first == nil {
						first = out
						continue
					}
					for i := range out {
						if math.Float32bits(out[i]) != math.Float32bits(first[i]) {
							t.Fatalf("%s/%s %dx%d n=%d: %d threads, call %d: out[%d] = %g, 1 thread %g", be, wt, rows, cols, n, threads, call, i, out[i], first[i])
						}
					}
				}
				pool.Close()
			}
		})
	}
}

func TestMatMulErrors(t *testing.T) {
	pool := NewPool(1)
	defer pool.Close()
	q4 := make([]byte, 2*weights.BlockBytesQ4_0)
	x := make([]float32, 64)
	out := make([]float32, 2)
	cases := []struct {
		name       string
		out        []float32
		w          []byte
		wt         weights.DType
		rows, cols int
		x          []float32
		n          int
	}{
		{"ok", out, q4, weights.Q4_0, 1, 64, x, 1},
		{"unsupported type", out, q4, weights.DType(999), 1, 64, x, 1},
		{"Q4_1 has no kernel", out, q4, weights.Q4_1, 1, 32, x, 1},
		{"cols not block multiple", out, q4, weights.Q4_0, 1, 48, x, 1},
		{"short weights", out, q4, weights.Q4_0, 2, 64, x, 1},
		{"short x", out, q4, weights.Q4_0, 1, 64, x, 2},
		{"short out", out, q4, weights.Q4_0, 1, 64, make([]float32, 128), 3},
		{"zero rows", out, q4, weights.Q4_0, 0, 64, x, 1},
		{"negative n", out, q4, weights.Q4_0, 1, 64, x, -1},
		{"K type short", out, q4, weights.Q4_K, 1, 256, make([]float32, 256), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := pool.MatMul(c.out, c.w, c.wt, c.rows, c.cols, c.x, c.n)
			if (err == nil) != (c.name == "ok") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// TestQuantizeActivations: every backend's activation quantizer produces
// the same integers and scales, within half a step of the input.
func TestQuantizeActivations(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, block := range []int{weights.QK, weights.QKK} {
		x := randomVector(rng, 3*block)
		x[5] = 0.5 * 127 / 127                         // exact halves exercise round-half-even
		copy(x[block:2*block], make([]float32, block)) // an all-zero block
		var first *quantized
		for _, be := range testBackends() {
			withBackend(t, be, func() {
				xq := quantizeActivations(x, block)
				got := &quantized{block: block, q: append([]int8(nil), xq.q...), d: append([]float32(nil), xq.d...), s: append([]int32(nil), xq.s...)}
				xq.release()
				for i, v := range x {
					d := got.d[i/block]
					if e := math.Abs(float64(v) - float64(d)*float64(got.q[i])); e > float64(d)*0.5000001 {
						t.Fatalf("%s: x[%d]=%g quantized to %d×%g", be, i, v, got.q[i], d)
					}
				}
				for g, s := range got.s {
					var want int32
					for _, v := range got.q[16*g : 16*g+16] {
						want += int32(v)
					}
					if s != want {
						t.Fatalf("%s: sum %d = %d, want %d", be, g, s, want)
					}
				}
				if first == nil {
					first = got
					return
				}
				for i := range got.q {
					if got.q[i] != first.q[i] {
						t.Fatalf("%s: q[%d] = %d, go %d", be, i, got.q[i], first.q[i])
					}
				}
				for i := range got.d {
					if got.d[i] != first.d[i] {
						t.Fatalf("%s: d[%d] = %g, go %g", be, i, got.d[i], first.d[i])
					}
				}
			})
		}
	}
}

// TestMatMulArbitraryBlocks feeds blocks no quantizer would write (random
// levels and scales, Q8_0 -128, Q6_K negative scales, Q4_K 6-bit extremes):
// the integer paths must not saturate or overflow on any of them.
func TestMatMulArbitraryBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	// f16 fields: byte offset in the block, for each type's scales.
	scaleAt := map[weights.DType][]int{
		weights.Q8_0: {0}, weights.Q4_0: {0}, weights.Q4_K: {0, 2}, weights.Q6_K: {208},
	}
	pool := NewPool(3)
	defer pool.Close()
	for wt, offs := range scaleAt {
		rows, cols, n := 9, 2*weights.QKK, 5
		rb, _ := wt.RowBytes(uint64(cols))
		w := make([]byte, int(rb)*rows)
		for i := range w {
			w[i] = byte(rng.Uint32())
		}
		bb := wt.TypeSize()
		for b := 0; b < len(w)/bb; b++ {
			for _, o := range offs {
				h := weights.F32ToF16(float32(rng.NormFloat64() * 0.01))
				w[b*bb+o], w[b*bb+o+1] = byte(h), byte(h>>8)
			}
			if wt == weights.Q8_0 && b%3 == 0 {
				w[b*bb+2] = 0x80 // -128
			}
		}
		deq := make([]float32, rows*cols)
		if err := weights.Dequantize(wt, w, deq); err != nil {
			t.Fatal(err)
		}
		x := randomVector(rng, n*cols)
		x[0] = 1e3 // one activation dominates its block
		ref, tol, mag := matmulBound(wt, deq, rows, cols, x, n)
		var goOut []float32
		for _, be := range testBackends() {
			withBackend(t, be, func() {
				out := make([]float32, n*rows)
				if err := pool.MatMul(out, w, wt, rows, cols, x, n); err != nil {
					t.Fatal(err)
				}
				for i, v := range out {
					if d := math.Abs(float64(v) - ref[i]); !(d <= tol[i]) {
						t.Fatalf("%s/%s: out[%d] = %g, reference %g: error %g > %g", wt, be, i, v, ref[i], d, tol[i])
					}
					if goOut != nil {
						g := goOut[i]
						if exactTypes[wt] && math.Float32bits(v) != math.Float32bits(g) {
							t.Fatalf("%s/%s: out[%d] = %g, go %g: not bit-identical", wt, be, i, v, g)
						}
						if d := math.Abs(float64(v) - float64(g)); d > 1e-6*mag[i] {
							t.Fatalf("%s/%s: out[%d] = %g, go %g", wt, be, i, v, g)
						}
					}
				}
				if goOut == nil {
					goOut = out
				}
			})
		}
	}
}

// TestMatMulBatchInvariant: a vector's outputs must not depend on the
// batch it is multiplied in (its index, or how many others share the
// call). Speculative decoding verifies a tree of tokens in one batch and
// promises the tokens the target would decode one at a time; a server
// batches clients and promises each the output it would get alone. Both
// hold only if every output bit is the same at any batch size.
func TestMatMulBatchInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pool := NewPool(2)
	defer pool.Close()
	for _, wt := range matmulTypes {
		// 83 blocks of 32 cross the batched kernel's 32-block chunks
		// and end in a partial step of 16.
		for _, cols := range append(colsFor(wt), 83*weights.QK) {
			if cols%wt.BlockSize() != 0 {
				continue
			}
			rows := 37
			w, _ := randomMatrix(t, rng, wt, rows, cols)
			const most = 19
			x := randomVector(rng, most*cols)
			for _, be := range testBackends() {
				withBackend(t, be, func() {
					alone := make([]float32, most*rows)
					for j := range most {
						if err := pool.MatMul(alone[j*rows:(j+1)*rows], w, wt, rows, cols, x[j*cols:(j+1)*cols], 1); err != nil {
							t.Fatal(err)
						}
					}
					for _, n := range []int{2, 3, 4, 5, 7, 8, 9, 16, most} {
						for _, first := range []int{0, most - n} {
							out := make([]float32, n*rows)
							if err := pool.MatMul(out, w, wt, rows, cols, x[first*cols:(first+n)*cols], n); err != nil {
								t.Fatal(err)
							}
							for i, v := range out {
								want := alone[first*rows+i]
								if math.Float32bits(v) != math.Float32bits(want) {
									t.Fatalf("%s/%s/cols=%d: vector %d of a batch of %d: out[%d] = %g, alone %g",
										be, wt, cols, first+i/rows, n, i%rows, v, want)
								}
							}
						}
					}
				})
			}
		}
	}
}

// Each output row has the same bits whether the kernel took it in a
// block of rows or alone: the AVX2 kernel sums float rows eight at a
// time with shared shuffles, and a pool's split or a 1-row call puts a
// row in or out of such a block, so the two orders must agree.
func TestMatMulRowBlocksMatchLoneRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	pool := NewPool(2)
	defer pool.Close()
	for _, wt := range matmulTypes {
		// 19 rows: two blocks of eight and three alone; 64 and 72
		// values take the blocks' path (16 and 8 at a time), 20 not.
		for _, cols := range []int{64, 72, 20, 256} {
			if cols%wt.BlockSize() != 0 {
				continue
			}
			const rows = 19
			w, _ := randomMatrix(t, rng, wt, rows, cols)
			rb, _ := wt.RowBytes(uint64(cols))
			for _, n := range []int{1, 2, 3, 4, 5, 8} {
				x := randomVector(rng, n*cols)
				for _, be := range testBackends() {
					withBackend(t, be, func() {
						all := make([]float32, n*rows)
						if err := pool.MatMul(all, w, wt, rows, cols, x, n); err != nil {
							t.Fatal(err)
						}
						for r := range rows {
							alone := make([]float32, n)
							if err := pool.MatMul(alone, w[r*int(rb):(r+1)*int(rb)], wt, 1, cols, x, n); err != nil {
								t.Fatal(err)
							}
							for j := range n {
								if got := all[j*rows+r]; math.Float32bits(got) != math.Float32bits(alone[j]) {
									t.Fatalf("%s/%s/cols=%d/n=%d: row %d, vector %d: %g among %d rows, %g alone",
										be, wt, cols, n, r, j, got, rows, alone[j])
								}
							}
						}
					})
				}
			}
		}
	}
}
