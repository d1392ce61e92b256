//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// These tests run every kernel against its pure-Go twin in package
// kernels (the "go" backend) on random inputs of awkward sizes. Where the
// two sum floats in a different order the tolerance is the float32
// rounding bound of both summation trees: u = 2^-24 times the depth of
// each tree times Σ|terms|. A wrong element, scale or index costs far
// more than that. Without a GPU the binary skips (internal/cuinit).

const u = 1.0 / (1 << 24) // float32 unit roundoff

var (
	gpuOnce sync.Once
	gpuDev  *Device
	gpuErr  error
)

// stream returns a Stream on GPU 0 (TANDEM_CUDA_DEVICE picks another),
// closed when the test ends.
func stream(t *testing.T) *Stream {
	t.Helper()
	gpuOnce.Do(func() {
		ord := 0
		if v := os.Getenv("TANDEM_CUDA_DEVICE"); v != "" {
			fmt.Sscan(v, &ord)
		}
		gpuDev, gpuErr = Open(ord)
		if gpuErr == nil {
			fmt.Printf("cuda tests on %s\n", gpuDev)
		}
	})
	if gpuErr != nil {
		t.Fatal(gpuErr)
	}
	s, err := gpuDev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// goKernels selects the pure-Go twins for the test.
func goKernels(t *testing.T) {
	prev := kernels.Backend()
	if err := kernels.SetBackend("go"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kernels.SetBackend(prev) })
}

// weightsOn copies a GGUF-layout matrix to the device with UploadWeights.
func weightsOn(t *testing.T, s *Stream, w []byte, wt weights.DType, rows, cols int) Buffer {
	t.Helper()
	buf := upload(t, s, make([]byte, len(w)))
	if err := s.UploadWeights(buf, w, wt, rows, cols); err != nil {
		t.Fatal(err)
	}
	return buf
}

// upload copies host data to a new device buffer freed with the test.
func upload[T any](t *testing.T, s *Stream, src []T) Buffer {
	t.Helper()
	b := bytesOf(src)
	buf, err := s.Device().Alloc(max(int64(len(b)), 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Sync(); s.Device().Free(buf) })
	if err := s.Upload(buf, b); err != nil {
		t.Fatal(err)
	}
	return buf
}

func download(t *testing.T, s *Stream, src Buffer, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := s.DownloadFloat32(out, src); err != nil {
		t.Fatal(err)
	}
	return out
}

func randomVector(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// randomMatrix returns rows×cols weights of type wt: quantized from
// normal values with outliers, or (arbitrary) random block bytes with
// small random scales, which no quantizer writes (Q8_0 -128 included).
func randomMatrix(t *testing.T, rng *rand.Rand, wt weights.DType, rows, cols int, arbitrary bool) []byte {
	t.Helper()
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		t.Fatal(err)
	}
	w := make([]byte, int(rb)*rows)
	if arbitrary {
		for i := range w {
			w[i] = byte(rng.Uint32())
		}
		bb := wt.TypeSize()
		for b := 0; b < len(w)/bb; b++ {
			h := weights.F32ToF16(float32(rng.NormFloat64() * 0.01))
			w[b*bb], w[b*bb+1] = byte(h), byte(h>>8)
		}
		return w
	}
	src := randomVector(rng, rows*cols)
	for i := 0; i < len(src)/50; i++ {
		src[rng.IntN(len(src))] *= 8
	}
	if err := weights.Quantize(wt, src, w); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestMatMul(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(1, 2))
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, wt := range MatMulTypes {
		cols := []int{1, 7, 96, 257, 1000}
		if wt.BlockSize() == weights.QK {
			cols = []int{32, 96, 288, 1024 + 32}
		}
		for _, c := range cols {
			for _, rows := range []int{1, 3, 17, 130} {
				for _, n := range []int{1, 2, 3, 8, 9, 17} {
					arbitrary := (wt == weights.Q8_0 || wt == weights.Q4_0) && rows == 17
					name := fmt.Sprintf("%s/%dx%d/n=%d", wt, rows, c, n)
					if arbitrary {
						name += "/arbitrary"
					}
					t.Run(name, func(t *testing.T) { checkMatMul(t, s, pool, rng, wt, rows, c, n, arbitrary) })
				}
			}
		}
	}
}

func checkMatMul(t *testing.T, s *Stream, pool *kernels.Pool, rng *rand.Rand, wt weights.DType, rows, cols, n int, arbitrary bool) {
	w := randomMatrix(t, rng, wt, rows, cols, arbitrary)
	x := randomVector(rng, n*cols)
	if arbitrary {
		x[0] = 1e3 // one activation dominates its block
	}
	want := make([]float32, n*rows)
	if err := pool.MatMul(want, w, wt, rows, cols, x, n); err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	if err := weights.Dequantize(wt, w, deq); err != nil {
		t.Fatal(err)
	}
	out := upload(t, s, make([]float32, n*rows+1))
	sentinel := []float32{42}
	if err := s.UploadFloat32(out.Slice(int64(n*rows)*4, 4), sentinel); err != nil {
		t.Fatal(err)
	}
	if err := s.MatMul(out, weightsOn(t, s, w, wt, rows, cols), wt, rows, cols, upload(t, s, x), n); err != nil {
		t.Fatal(err)
	}
	got := download(t, s, out, n*rows+1)
	if got[n*rows] != 42 {
		t.Fatalf("wrote past n*rows")
	}
	// Depth of the summation trees: the Go twin sums float columns in
	// four lanes (quantized blocks serially); a GPU lane sums every 32nd
	// column or block, then 5 shuffle levels.
	terms := cols
	goDepth := cols/4 + 2
	if bs := wt.BlockSize(); bs > 1 {
		terms = cols / bs
		goDepth = terms
	}
	depth := float64(goDepth + terms/32 + 1 + 5 + 2)
	for j := 0; j < n; j++ {
		for r := 0; r < rows; r++ {
			var mag float64
			for c := 0; c < cols; c++ {
				mag += math.Abs(float64(deq[r*cols+c]) * float64(x[j*cols+c]))
			}
			i := j*rows + r
			if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= depth*u*mag*1.5+1e-30) {
				t.Fatalf("out[%d] (vector %d row %d) = %g, go twin %g: |diff| %.3g > %.3g (depth %g, Σ|w·x| %.3g)", i, j, r, got[i], want[i], d, depth*u*mag*1.5, depth, mag)
			}
		}
	}
}

func TestMatMulErrors(t *testing.T) {
	s := stream(t)
	w := upload(t, s, make([]byte, 2*weights.BlockBytesQ4_0))
	x := upload(t, s, make([]float32, 64))
	out := upload(t, s, make([]float32, 2))
	for _, c := range []struct {
		name       string
		wt         weights.DType
		rows, cols int
		n          int
	}{
		{"Q4_K has no GPU kernel", weights.Q4_K, 1, 256, 1},
		{"cols not block multiple", weights.Q4_0, 1, 48, 1},
		{"short weights", weights.Q4_0, 2, 64, 1},
		{"short x", weights.Q4_0, 1, 64, 2},
		{"short out", weights.Q4_0, 1, 32, 3},
		{"zero rows", weights.Q4_0, 0, 64, 1},
		{"negative n", weights.Q4_0, 1, 64, -1},
	} {
		if err := s.MatMul(out, w, c.wt, c.rows, c.cols, x, c.n); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if err := s.MatMul(out, w, weights.Q4_0, 1, 64, x, 1); err != nil {
		t.Errorf("valid call after rejected ones: %v", err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestRMSNorm(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dim := range []int{1, 7, 64, 257, 4096} {
		for _, n := range []int{1, 3, 17} {
			for _, indexed := range []bool{false, true} {
				t.Run(fmt.Sprintf("dim=%d/n=%d/indexed=%v", dim, n, indexed), func(t *testing.T) {
					x := randomVector(rng, n*dim)
					w := randomVector(rng, dim)
					var rows []int32
					var rowBuf Buffer
					if indexed {
						for j := 0; j < n; j++ {
							rows = append(rows, int32(rng.IntN(n)))
						}
						rowBuf = upload(t, s, rows)
					}
					out := upload(t, s, make([]float32, n*dim))
					if err := s.RMSNorm(out, upload(t, s, x), upload(t, s, w), rowBuf, dim, n, 1e-5); err != nil {
						t.Fatal(err)
					}
					got := download(t, s, out, n*dim)
					for j := 0; j < n; j++ {
						src := j
						if indexed {
							src = int(rows[j])
						}
						want := make([]float32, dim)
						kernels.RMSNorm(want, x[src*dim:(src+1)*dim], w, 1e-5)
						// Σx² is summed in another order (depth dim on the
						// host, dim/256+13 here); the scale's relative
						// error is half the sum's.
						tol := float64(dim+64) * u
						for i, v := range want {
							if d := math.Abs(float64(got[j*dim+i] - v)); !(d <= tol*math.Abs(float64(v))+1e-30) {
								t.Fatalf("vector %d [%d] = %g, go twin %g (|diff| %.3g)", j, i, got[j*dim+i], v, d)
							}
						}
					}
				})
			}
		}
	}
}

func TestRoPE(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		heads, kvHeads, hd int
		theta              float32
	}{
		{1, 1, 2, 10000}, {6, 2, 6, 10000}, {8, 4, 64, 10000}, {32, 8, 128, 500000}, {3, 0, 16, 10000},
	} {
		t.Run(fmt.Sprintf("%d-%d-%d-%g", tc.heads, tc.kvHeads, tc.hd, tc.theta), func(t *testing.T) {
			n := 37
			pos := make([]int32, n)
			for i := range pos {
				pos[i] = int32(rng.IntN(8192))
			}
			pos[0], pos[1] = 0, 4095
			q := randomVector(rng, n*tc.heads*tc.hd)
			k := randomVector(rng, n*tc.kvHeads*tc.hd)
			qb := upload(t, s, q)
			var kb Buffer
			if tc.kvHeads > 0 {
				kb = upload(t, s, k)
			}
			if err := s.RoPE(qb, kb, upload(t, s, pos), n, tc.heads, tc.kvHeads, tc.hd, tc.theta); err != nil {
				t.Fatal(err)
			}
			gq := download(t, s, qb, len(q))
			var gk []float32
			if tc.kvHeads > 0 {
				gk = download(t, s, kb, len(k))
			}
			for j := 0; j < n; j++ {
				kernels.RoPE(q[j*tc.heads*tc.hd:(j+1)*tc.heads*tc.hd], tc.heads, tc.hd, int(pos[j]), tc.theta)
				kernels.RoPE(k[j*tc.kvHeads*tc.hd:(j+1)*tc.kvHeads*tc.hd], tc.kvHeads, tc.hd, int(pos[j]), tc.theta)
			}
			// The angle's float64 pow, sin and cos may differ from Go's by
			// an ulp of float64, which can move the float32 results by one
			// of their own ulps: 4u of the pair's magnitude covers it.
			check := func(name string, got, want []float32) {
				for i := 0; i < len(want); i += 2 {
					mag := math.Abs(float64(want[i])) + math.Abs(float64(want[i+1]))
					for e := 0; e < 2; e++ {
						if d := math.Abs(float64(got[i+e] - want[i+e])); d > 4*u*mag {
							t.Fatalf("%s[%d] = %g, go twin %g (|diff| %.3g)", name, i+e, got[i+e], want[i+e], d)
						}
					}
				}
			}
			check("q", gq, q)
			check("k", gk, k)
		})
	}
}

func TestElementwise(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 255, 257, 100003} {
		g := randomVector(rng, n)
		up := randomVector(rng, n)
		g[0] = -90 // exp(90) overflows float32: silu is then -0
		gb, ub := upload(t, s, g), upload(t, s, up)
		if err := s.SiLUMul(gb, ub, n); err != nil {
			t.Fatal(err)
		}
		got := download(t, s, gb, n)
		kernels.SiLUMul(g, up)
		for i := range g {
			// expf is within 2 ulps of the float64 exp the host rounds.
			if d := math.Abs(float64(got[i] - g[i])); !(d <= 8*u*math.Abs(float64(g[i]))) {
				t.Fatalf("silu n=%d [%d] = %g, go twin %g", n, i, got[i], g[i])
			}
		}
		a, b := randomVector(rng, n), randomVector(rng, n)
		ab := upload(t, s, a)
		if err := s.Add(ab, upload(t, s, b), n); err != nil {
			t.Fatal(err)
		}
		got = download(t, s, ab, n)
		kernels.Add(a, b)
		for i := range a {
			if got[i] != a[i] {
				t.Fatalf("add n=%d [%d] = %g, go twin %g", n, i, got[i], a[i])
			}
		}
	}
}

func TestEmbed(t *testing.T) {
	s := stream(t)
	rng := rand.New(rand.NewPCG(9, 10))
	for _, wt := range EmbedTypes {
		dim := 65
		if wt.BlockSize() > 1 {
			dim = 96
		}
		vocab := 300
		table := randomMatrix(t, rng, wt, vocab, dim, false)
		tokens := []int32{0, 299, 7, 7, 150}
		out := upload(t, s, make([]float32, len(tokens)*dim))
		if err := s.Embed(out, weightsOn(t, s, table, wt, vocab, dim), wt, vocab, upload(t, s, tokens), len(tokens), dim); err != nil {
			t.Fatal(err)
		}
		got := download(t, s, out, len(tokens)*dim)
		rb, _ := wt.RowBytes(uint64(dim))
		want := make([]float32, dim)
		for j, tok := range tokens {
			if err := weights.Dequantize(wt, table[int(tok)*int(rb):(int(tok)+1)*int(rb)], want); err != nil {
				t.Fatal(err)
			}
			for i, v := range want {
				if math.Float32bits(got[j*dim+i]) != math.Float32bits(v) {
					t.Fatalf("%s token %d [%d] = %g, weights.Dequantize %g", wt, tok, i, got[j*dim+i], v)
				}
			}
		}
	}
}

// kvCase is a device KV cache of a few sequences mirrored by a host
// kv.Cache, the twin the device rows are compared with.
type kvCase struct {
	layout KV
	host   *kv.Cache
	seqs   []Buffer
}

func newKVCase(t *testing.T, s *Stream, layout KV, nseq int) *kvCase {
	typ := weights.F32
	if layout.F16 {
		typ = weights.F16
	}
	host, err := kv.New(kv.Config{Layers: layout.Layers, KVDim: layout.KVDim, Context: layout.Context, Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	c := &kvCase{layout: layout, host: host}
	for i := 0; i < nseq; i++ {
		if _, err := host.NewSeq(); err != nil {
			t.Fatal(err)
		}
		b, err := s.Device().Alloc(layout.SeqBytes())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Sync(); s.Device().Free(b) })
		c.seqs = append(c.seqs, b)
	}
	return c
}

// put writes vectors k, v (one per slot) for slots of sequences seq at
// rows, on both sides.
func (c *kvCase) put(t *testing.T, s *Stream, layer int, seq []int, rows []int32, k, v []float32) {
	kvd := c.layout.KVDim
	bases := make([]uint64, len(seq))
	for j, sq := range seq {
		bases[j] = uint64(c.seqs[sq].Ptr())
		c.host.Put(sq, layer, int(rows[j]), k[j*kvd:(j+1)*kvd], v[j*kvd:(j+1)*kvd])
	}
	if err := s.KVPut(c.layout, layer, upload(t, s, k), upload(t, s, v), upload(t, s, bases), upload(t, s, rows), len(seq)); err != nil {
		t.Fatal(err)
	}
}

// check compares rows [0, rows) of every plane of sequence sq.
func (c *kvCase) check(t *testing.T, s *Stream, sq, rows int) {
	t.Helper()
	raw := make([]byte, c.layout.SeqBytes())
	if err := s.Download(raw, c.seqs[sq]); err != nil {
		t.Fatal(err)
	}
	kvd, ctx := c.layout.KVDim, c.layout.Context
	for l := 0; l < c.layout.Layers; l++ {
		for plane := 0; plane < 2; plane++ {
			base := (2*l + plane) * ctx * kvd
			for i := 0; i < rows*kvd; i++ {
				var got, want uint32
				if c.layout.F16 {
					got = uint32(raw[2*(base+i)]) | uint32(raw[2*(base+i)+1])<<8
					h := c.host.K16(sq, l)
					if plane == 1 {
						h = c.host.V16(sq, l)
					}
					want = uint32(h[i])
				} else {
					got = uint32(raw[4*(base+i)]) | uint32(raw[4*(base+i)+1])<<8 | uint32(raw[4*(base+i)+2])<<16 | uint32(raw[4*(base+i)+3])<<24
					h := c.host.K(sq, l)
					if plane == 1 {
						h = c.host.V(sq, l)
					}
					want = math.Float32bits(h[i])
				}
				if got != want {
					t.Fatalf("seq %d layer %d plane %d row %d [%d]: device %#x, host %#x", sq, l, plane, i/kvd, i%kvd, got, want)
				}
			}
		}
	}
}

// TestKVPutCommit writes a token tree's rows, commits a path through it
// (kv.Cache.Commit), mirrors the moves on the device and compares every
// row bit for bit, F16 rounding included.
func TestKVPutCommit(t *testing.T) {
	s := stream(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, f16 := range []bool{false, true} {
		t.Run(fmt.Sprintf("f16=%v", f16), func(t *testing.T) {
			layout := KV{Layers: 3, Context: 40, KVDim: 12, F16: f16}
			c := newKVCase(t, s, layout, 2)
			// Sequence 1: 5 committed rows, then a tree of 9 tentative rows.
			parents := []int{-1, 0, 1, 0, 3, 2, 5, 4, 6}
			n := 5 + len(parents)
			if _, err := c.host.Reserve(1, 5); err != nil {
				t.Fatal(err)
			}
			c.host.CommitAll(1)
			if _, err := c.host.Reserve(1, len(parents)); err != nil {
				t.Fatal(err)
			}
			for r, p := range parents {
				if err := c.host.Link(1, r, p); err != nil {
					t.Fatal(err)
				}
			}
			seq := make([]int, n)
			rows := make([]int32, n)
			for i := range seq {
				seq[i], rows[i] = 1, int32(i)
			}
			for l := 0; l < layout.Layers; l++ {
				k := randomVector(rng, n*layout.KVDim)
				v := randomVector(rng, n*layout.KVDim)
				k[0], k[1], v[2] = 1e-6, 7e4, 3e-8 // half subnormal, overflow, underflow
				c.put(t, s, l, seq, rows, k, v)
			}
			c.check(t, s, 1, n)
			// Commit the path 0 -> 2 -> 5 -> 6: rows 2, 5 and 6 move down,
			// row 5 onto row 2's old place after row 2 has left it.
			base := c.host.Len(1)
			path := []int{0, 2, 5, 6}
			if err := c.host.Link(1, 2, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.host.Commit(1, path); err != nil {
				t.Fatal(err)
			}
			var dst, src []int32
			for i, r := range path {
				dst, src = append(dst, int32(base+i)), append(src, int32(base+r))
			}
			if err := s.KVMove(layout, c.seqs[1], dst, src); err != nil {
				t.Fatal(err)
			}
			if c.host.Len(1) != 9 || c.host.Tentative(1) != 0 {
				t.Fatalf("host cache has %d committed and %d tentative rows, want 9 and 0", c.host.Len(1), c.host.Tentative(1))
			}
			c.check(t, s, 1, c.host.Len(1))
		})
	}
}

// TestKVCopy copies a sequence's first rows over another's, as
// kv.Cache.CopyPrefix does on the host (a prefix shared between
// requests), and compares every row bit for bit; rows past the copy keep
// what they held.
func TestKVCopy(t *testing.T) {
	s := stream(t)
	rng := rand.New(rand.NewPCG(15, 16))
	for _, f16 := range []bool{false, true} {
		t.Run(fmt.Sprintf("f16=%v", f16), func(t *testing.T) {
			layout := KV{Layers: 3, Context: 40, KVDim: 12, F16: f16}
			c := newKVCase(t, s, layout, 2)
			const n, copied = 30, 17
			for sq := range 2 {
				seq := make([]int, n)
				rows := make([]int32, n)
				for i := range seq {
					seq[i], rows[i] = sq, int32(i)
				}
				if _, err := c.host.Reserve(sq, n); err != nil {
					t.Fatal(err)
				}
				c.host.CommitAll(sq)
				for l := 0; l < layout.Layers; l++ {
					c.put(t, s, l, seq, rows, randomVector(rng, n*layout.KVDim), randomVector(rng, n*layout.KVDim))
				}
			}
			if err := c.host.CopyPrefix(1, 0, copied); err != nil {
				t.Fatal(err)
			}
			if err := s.KVCopy(layout, c.seqs[1], c.seqs[0], copied); err != nil {
				t.Fatal(err)
			}
			c.check(t, s, 1, n) // the host's rows past the copy are untouched too
			c.check(t, s, 0, n)
			if err := s.KVCopy(layout, c.seqs[1], c.seqs[0], layout.Context+1); err == nil {
				t.Error("KVCopy past the context succeeded")
			}
		})
	}
}

// TestAttention runs a batch over two sequences: a chain continuing one
// (prefill), a token tree under the other, and a slot with no committed
// rows, with grouped-query heads, against kernels.Attention per head.
func TestAttention(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(13, 14))
	for _, f16 := range []bool{false, true} {
		for _, tc := range []struct{ heads, kvHeads, hd int }{{1, 1, 8}, {6, 2, 24}, {8, 8, 64}, {4, 1, 96}, {16, 4, 128}, {2, 1, 256}} {
			t.Run(fmt.Sprintf("f16=%v/%d-%d-%d", f16, tc.heads, tc.kvHeads, tc.hd), func(t *testing.T) {
				checkAttention(t, s, rng, f16, tc.heads, tc.kvHeads, tc.hd)
			})
		}
	}
}

func checkAttention(t *testing.T, s *Stream, rng *rand.Rand, f16 bool, heads, kvHeads, hd int) {
	kvd := kvHeads * hd
	layout := KV{Layers: 2, Context: 300, KVDim: kvd, F16: f16}
	const layer = 1
	c := newKVCase(t, s, layout, 3)
	committed := []int{0, 37, 251}
	// Fill committed rows plus room for this batch's rows.
	for sq, nc := range committed {
		rows := nc + 12
		seq := make([]int, rows)
		idx := make([]int32, rows)
		for i := range seq {
			seq[i], idx[i] = sq, int32(i)
		}
		c.put(t, s, layer, seq, idx, randomVector(rng, rows*kvd), randomVector(rng, rows*kvd))
	}
	// Slots: seq 0 (empty) a chain of 3; seq 1 a tree; seq 2 one decode slot.
	type slot struct {
		seq    int
		prefix int
		anc    []int32
	}
	var slots []slot
	for i := 0; i < 3; i++ {
		var anc []int32
		for r := 0; r <= i; r++ {
			anc = append(anc, int32(r))
		}
		slots = append(slots, slot{0, 0, anc})
	}
	base := int32(committed[1])
	for _, anc := range [][]int32{{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 2, 4}, {0, 2, 4, 5}} {
		var rows []int32
		for _, r := range anc {
			rows = append(rows, base+r)
		}
		slots = append(slots, slot{1, committed[1], rows})
	}
	slots = append(slots, slot{2, committed[2], []int32{int32(committed[2])}})

	n := len(slots)
	q := randomVector(rng, n*heads*hd)
	for i := range q {
		q[i] *= 2 // sharper attention than unit vectors give
	}
	var prefix, anc, lo, hi []int32
	var bases []uint64
	maxLen := 0
	for _, sl := range slots {
		prefix = append(prefix, int32(sl.prefix))
		lo = append(lo, int32(len(anc)))
		anc = append(anc, sl.anc...)
		hi = append(hi, int32(len(anc)))
		bases = append(bases, uint64(c.seqs[sl.seq].Ptr()))
		maxLen = max(maxLen, sl.prefix+len(sl.anc))
	}
	out := upload(t, s, make([]float32, n*heads*hd))
	scale := float32(1 / math.Sqrt(float64(hd)))
	err := s.Attention(layout, layer, &Attention{
		Out: out, Q: upload(t, s, q), Bases: upload(t, s, bases),
		Prefix: upload(t, s, prefix), Anc: upload(t, s, anc), Lo: upload(t, s, lo), Hi: upload(t, s, hi),
		N: n, Heads: heads, KVHeads: kvHeads, Head: hd, MaxLen: maxLen, Scale: scale,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := download(t, s, out, n*heads*hd)

	group := heads / kvHeads
	want := make([]float32, hd)
	scores := make([]float32, maxLen)
	for i, sl := range slots {
		for h := 0; h < heads; h++ {
			qh := q[(i*heads+h)*hd : (i*heads+h+1)*hd]
			off := (h / group) * hd
			if f16 {
				kernels.AttentionF16(want, qh, c.host.K16(sl.seq, layer), c.host.V16(sl.seq, layer), 1, kvd, off, sl.prefix, sl.anc, scale, scores)
			} else {
				kernels.Attention(want, qh, c.host.K(sl.seq, layer), c.host.V(sl.seq, layer), 1, kvd, off, sl.prefix, sl.anc, scale, scores)
			}
			tol := attentionBound(c.host, sl.seq, layer, f16, qh, kvd, off, sl.prefix, sl.anc, scale)
			for d := range want {
				g := got[(i*heads+h)*hd+d]
				if diff := math.Abs(float64(g - want[d])); !(diff <= tol[d]) {
					t.Fatalf("slot %d (seq %d, %d committed, ancestors %v) head %d [%d] = %g, go twin %g: |diff| %.3g > %.3g",
						i, sl.seq, sl.prefix, sl.anc, h, d, g, want[d], diff, tol[d])
				}
			}
		}
	}
}

// attentionBound is, per output dimension, the float32 rounding bound of
// the host and device evaluations together: a score's dot product of hd
// terms errs by at most (hd+2)u·S (S the largest Σ|q·k|·scale over the
// rows), which moves each probability by a factor of at most 2·that;
// normalising and expf add (len+8)u; the weighted sum of len value rows
// adds (len+2)u. All scale with V_d = Σ_t p_t·|v_t[d]|.
func attentionBound(c *kv.Cache, seq, layer int, f16 bool, q []float32, kvd, off, prefix int, anc []int32, scale float32) []float64 {
	hd := len(q)
	rowAt := func(t int) int {
		if t < prefix {
			return t
		}
		return int(anc[t-prefix])
	}
	val := func(plane, row, d int) float64 {
		i := row*kvd + off + d
		if f16 {
			p := c.K16(seq, layer)
			if plane == 1 {
				p = c.V16(seq, layer)
			}
			return float64(weights.F16ToF32(p[i]))
		}
		p := c.K(seq, layer)
		if plane == 1 {
			p = c.V(seq, layer)
		}
		return float64(p[i])
	}
	n := prefix + len(anc)
	sc := make([]float64, n)
	var S, m float64
	m = math.Inf(-1)
	for t := 0; t < n; t++ {
		var dot, abs float64
		for d := 0; d < hd; d++ {
			dot += float64(q[d]) * val(0, rowAt(t), d)
			abs += math.Abs(float64(q[d]) * val(0, rowAt(t), d))
		}
		sc[t] = dot * float64(scale)
		S = max(S, abs*float64(scale))
		m = max(m, sc[t])
	}
	var sum float64
	for t := range sc {
		sc[t] = math.Exp(sc[t] - m)
		sum += sc[t]
	}
	rel := 2*(2*float64(hd+2)*u*S) + 2*float64(2*n+10)*u
	tol := make([]float64, hd)
	for d := range tol {
		var V float64
		for t := range sc {
			V += sc[t] / sum * math.Abs(val(1, rowAt(t), d))
		}
		tol[d] = rel*V + 1e-30
	}
	return tol
}

// TestGraph records a matmul (with its activation quantizer), a silu and
// an add, replays the recording on new inputs uploaded into the same
// buffers, and holds it bit for bit to the same kernels run directly.
func TestGraph(t *testing.T) {
	s := stream(t)
	rng := rand.New(rand.NewPCG(15, 16))
	rows, cols, n := 67, 96, 3
	w := weightsOn(t, s, randomMatrix(t, rng, weights.Q8_0, rows, cols, false), weights.Q8_0, rows, cols)
	x := upload(t, s, make([]float32, n*cols))
	out := upload(t, s, make([]float32, n*rows))
	up := upload(t, s, make([]float32, n*rows))
	acc := upload(t, s, make([]float32, n*rows))
	run := func() error {
		return errors.Join(s.MatMul(out, w, weights.Q8_0, rows, cols, x, n), s.SiLUMul(out, up, n*rows), s.Add(acc, out, n*rows))
	}
	if err := s.Reserve(MatMulScratch(n, cols)); err != nil {
		t.Fatal(err)
	}
	gen := s.Generation()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	if err := s.Upload(x, make([]byte, 4)); err == nil {
		t.Fatal("an upload during a capture was accepted")
	}
	s.err = nil // the refused upload failed the stream; the test goes on
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if s.Generation() != gen {
		t.Fatal("the capture grew the scratch")
	}
	inputs := func() {
		for _, b := range []Buffer{x, up, acc} {
			if err := s.UploadFloat32(b, randomVector(rng, int(b.Size()/4))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := 0; round < 3; round++ {
		inputs()
		xs, ups, accs := download(t, s, x, n*cols), download(t, s, up, n*rows), download(t, s, acc, n*rows)
		if err := s.Launch(g); err != nil {
			t.Fatal(err)
		}
		replayed := download(t, s, acc, n*rows)
		for _, p := range []struct {
			b Buffer
			v []float32
		}{{x, xs}, {up, ups}, {acc, accs}} {
			if err := s.UploadFloat32(p.b, p.v); err != nil {
				t.Fatal(err)
			}
		}
		if err := run(); err != nil {
			t.Fatal(err)
		}
		direct := download(t, s, acc, n*rows)
		for i := range direct {
			if math.Float32bits(direct[i]) != math.Float32bits(replayed[i]) {
				t.Fatalf("round %d [%d]: replayed %g, direct %g", round, i, replayed[i], direct[i])
			}
		}
	}
}

// TestMatMulReuse: consecutive projections of one input share its
// quantization, and writing the input (a kernel, an upload, a matmul
// into it) makes the next one quantize afresh; MatMulAdd adds the
// product to what out held.
func TestMatMulReuse(t *testing.T) {
	goKernels(t)
	s := stream(t)
	rng := rand.New(rand.NewPCG(17, 18))
	pool := kernels.NewPool(2)
	defer pool.Close()
	const rows, cols, n = 96, 96, 3 // square: a product can be an input
	for _, wt := range []weights.DType{weights.Q8_0, weights.Q4_0} {
		w1, w2 := randomMatrix(t, rng, wt, rows, cols, false), randomMatrix(t, rng, wt, rows, cols, false)
		d1, d2 := weightsOn(t, s, w1, wt, rows, cols), weightsOn(t, s, w2, wt, rows, cols)
		x := randomVector(rng, n*cols)
		xb := upload(t, s, x)
		out := upload(t, s, make([]float32, n*rows))
		want := func(w []byte, x []float32) []float32 {
			o := make([]float32, n*rows)
			if err := pool.MatMul(o, w, wt, rows, cols, x, n); err != nil {
				t.Fatal(err)
			}
			return o
		}
		check := func(step string, want []float32) {
			t.Helper()
			got := download(t, s, out, n*rows)
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("%s %s: out[%d] = %g, go twin %g", wt, step, i, got[i], want[i])
				}
			}
		}
		mm := func(w Buffer, x Buffer) {
			t.Helper()
			if err := s.MatMul(out, w, wt, rows, cols, x, n); err != nil {
				t.Fatal(err)
			}
		}
		mm(d1, xb)
		check("first", want(w1, x))
		mm(d2, xb) // reuses x's quantization
		check("second, same input", want(w2, x))
		y := randomVector(rng, n*cols)
		if err := s.Add(xb, upload(t, s, y), n*cols); err != nil {
			t.Fatal(err)
		}
		kernels.Add(x, y)
		mm(d1, xb)
		check("after an add into the input", want(w1, x))
		// out as an input (quantized), then rewritten by an F16 matmul,
		// which quantizes nothing: the next use must not reuse the old
		// quantization.
		mm2 := upload(t, s, make([]float32, n*rows))
		if err := s.MatMul(mm2, d2, wt, rows, cols, out, n); err != nil {
			t.Fatal(err)
		}
		wf := randomMatrix(t, rng, weights.F16, rows, cols, false)
		if err := s.MatMul(out, weightsOn(t, s, wf, weights.F16, rows, cols), weights.F16, rows, cols, xb, n); err != nil {
			t.Fatal(err)
		}
		if err := s.MatMul(mm2, d2, wt, rows, cols, out, n); err != nil {
			t.Fatal(err)
		}
		got := download(t, s, mm2, n*rows)
		fx := make([]float32, n*rows)
		if err := pool.MatMul(fx, wf, weights.F16, rows, cols, x, n); err != nil {
			t.Fatal(err)
		}
		exp := want(w2, fx)
		for i := range exp {
			// The GPU's and Go's F16 products differ by float rounding,
			// which can flip a few quantized activations (half a step
			// each); a stale quantization would be off by the whole value.
			if d := math.Abs(float64(got[i] - exp[i])); d > 0.05*(1+math.Abs(float64(exp[i]))) {
				t.Fatalf("%s: product of a rewritten input [%d] = %g, go twin %g", wt, i, got[i], exp[i])
			}
		}
		// MatMulAdd: out = acc + W·x with the roundings of MatMul then Add.
		acc := randomVector(rng, n*rows)
		if err := s.UploadFloat32(out, acc); err != nil {
			t.Fatal(err)
		}
		if err := s.MatMulAdd(out, d1, wt, rows, cols, xb, n); err != nil {
			t.Fatal(err)
		}
		sum := want(w1, x)
		kernels.Add(sum, acc)
		check("MatMulAdd", sum)
	}
}
