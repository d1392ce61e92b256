package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/tandem-llm/tandem/weights"
)

// MatMul computes out[j*rows+r] = Σ_c W[r][c]·x[j*cols+c] for each of
// the n activation vectors x[j*cols:(j+1)*cols]. w holds rows rows of cols
// elements of type wt in GGUF layout (row r starts at r*wt.RowBytes(cols)).
// Work is split over rows; each weight row is read once for all n
// vectors, which is what makes prefill and tree verification cheaper per
// token than decode. Each vector's outputs are the same bits whatever
// n is and wherever the vector sits in the batch (every backend, every
// level; TestMatMulBatchInvariant), so a batched verification sees the
// logits one-token decode would.
//
// Quantized weights (Q8_0, Q4_0, Q4_K, Q6_K) multiply activations
// quantized once per call to int8 blocks (see quantized), with integer dot
// products per block, as fast CPU engines do; F32, F16 and BF16 weights
// use float arithmetic.
func (p *Pool) MatMul(out []float32, w []byte, wt weights.DType, rows, cols int, x []float32, n int) error {
	if err := checkMatMul(out, w, wt, rows, cols, x, n); err != nil {
		return err
	}
	var xq *quantized
	if blk := activationBlock(wt); blk > 0 {
		xq = quantizeActivations(x[:n*cols], blk)
		defer xq.release()
	}
	p.mm = matmulJob{be: backend, out: out, w: w, wt: wt, rowBytes: rowSize(wt, cols), rows: rows, cols: cols, x: x, xq: xq, n: n}
	p.RunJobWork(rows, rowGroup, float64(rows)*float64(cols)*float64(n), &p.mm)
	p.mm = matmulJob{} // drop the references to the caller's buffers
	return nil
}

// matmulJob is one MatMul's arguments, kept in its Pool so that a call
// allocates nothing.
type matmulJob struct {
	be            *impl
	out           []float32
	w             []byte
	wt            weights.DType
	rowBytes      int
	rows, cols, n int
	x             []float32
	xq            *quantized
}

func (j *matmulJob) Run(lo, hi int) {
	j.be.matmul(j.out, j.w, j.wt, j.rowBytes, lo, hi, j.rows, j.cols, j.x, j.xq, j.n)
}

// rowGroup keeps thread chunks on multiples of 4 rows, so SIMD kernels
// that interleave rows never straddle two workers.
const rowGroup = 4

func rowSize(wt weights.DType, cols int) int {
	rb, _ := wt.RowBytes(uint64(cols))
	return int(rb)
}

const maxDim = 1 << 30

func checkMatMul(out []float32, w []byte, wt weights.DType, rows, cols int, x []float32, n int) error {
	switch wt {
	case weights.F32, weights.F16, weights.BF16, weights.Q8_0, weights.Q4_0, weights.Q4_K, weights.Q6_K:
	default:
		return fmt.Errorf("kernels: matmul: no kernel for weight type %s", wt)
	}
	if rows <= 0 || cols <= 0 || n <= 0 {
		return fmt.Errorf("kernels: matmul: rows %d, cols %d, n %d must be positive", rows, cols, n)
	}
	// Bounded so that no size product below can overflow.
	if rows > maxDim || cols > maxDim || n > maxDim {
		return fmt.Errorf("kernels: matmul: rows %d, cols %d, n %d: each must be at most %d", rows, cols, n, maxDim)
	}
	if cols%wt.BlockSize() != 0 {
		return fmt.Errorf("kernels: matmul: %d columns is not a multiple of the %s block size %d", cols, wt, wt.BlockSize())
	}
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		return fmt.Errorf("kernels: matmul: %w", err)
	}
	switch {
	case uint64(len(w)) < rb*uint64(rows):
		return fmt.Errorf("kernels: matmul: weights hold %d bytes, %d rows of %d %s need %d", len(w), rows, cols, wt, rb*uint64(rows))
	case len(x) < n*cols:
		return fmt.Errorf("kernels: matmul: %d activations, %d vectors of %d need %d", len(x), n, cols, n*cols)
	case len(out) < n*rows:
		return fmt.Errorf("kernels: matmul: output holds %d, %d vectors of %d rows need %d", len(out), n, rows, n*rows)
	}
	return nil
}

// quantized holds activations as blocks of int8 with one float32 scale
// each (scale = max|x|/127, value = round-half-even(x/scale)): 32-value
// blocks (Q8_0-style) for Q8_0/Q4_0 weights and 256-value blocks
// (Q8_K-style) for the K-quants, which also need the sum of every 16
// values to apply their offsets.
type quantized struct {
	block int
	q     []int8
	d     []float32 // one per block
	s     []int32   // sum of q over each 16 values
}

var quantizedPool = sync.Pool{New: func() any { return new(quantized) }}

// activationBlock is the activation block length used with weight type wt,
// or 0 when wt multiplies float activations.
func activationBlock(wt weights.DType) int {
	switch wt {
	case weights.Q8_0, weights.Q4_0:
		return weights.QK
	case weights.Q4_K, weights.Q6_K:
		return weights.QKK
	}
	return 0
}

// quantizeActivations quantizes x (a multiple of block values long).
func quantizeActivations(x []float32, block int) *quantized {
	xq := quantizedPool.Get().(*quantized)
	xq.block = block
	nb := len(x) / block
	xq.q = growSlice(xq.q, len(x))
	xq.d = growSlice(xq.d, nb)
	xq.s = growSlice(xq.s, len(x)/16)
	backend.quantize(x, xq.q, xq.d, xq.s, block)
	return xq
}

func (xq *quantized) release() { quantizedPool.Put(xq) }

// goQuantize is the activation quantizer. The C one computes the same
// float32 operations (no fused multiply-add, round half to even), so both
// backends multiply identical integers.
func goQuantize(x []float32, q []int8, d []float32, s []int32, block int) {
	for b := 0; b < len(x)/block; b++ {
		xb := x[b*block : (b+1)*block]
		qb := q[b*block : (b+1)*block]
		var amax float32
		for _, v := range xb {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		scale := amax / 127
		var inv float32
		if scale != 0 {
			inv = 1 / scale
		}
		for i, v := range xb {
			qb[i] = int8(math.RoundToEven(float64(v * inv)))
		}
		d[b] = scale
	}
	for g := range s {
		var sum int32
		for _, v := range q[16*g : 16*g+16] {
			sum += int32(v)
		}
		s[g] = sum
	}
}

func growSlice[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// goMatMul is the pure-Go matmul over rows [lo, hi).
//
// The explicit float32 conversions around products forbid fused
// multiply-adds (which Go emits on arm64), keeping the float steps those
// of the C kernels.
func goMatMul(out []float32, w []byte, wt weights.DType, rowBytes, lo, hi, rows, cols int, x []float32, xq *quantized, n int) {
	switch wt {
	case weights.Q8_0:
		goMatMulQ8_0(out, w, rowBytes, lo, hi, rows, cols, xq, n)
	case weights.Q4_0:
		goMatMulQ4_0(out, w, rowBytes, lo, hi, rows, cols, xq, n)
	case weights.Q4_K:
		goMatMulQ4_K(out, w, rowBytes, lo, hi, rows, cols, xq, n)
	case weights.Q6_K:
		goMatMulQ6_K(out, w, rowBytes, lo, hi, rows, cols, xq, n)
	default:
		goMatMulFloat(out, w, wt, rowBytes, lo, hi, rows, cols, x, n)
	}
}

func goMatMulQ8_0(out []float32, w []byte, rowBytes, lo, hi, rows, cols int, xq *quantized, n int) {
	tab := f16Table()
	nb := cols / weights.QK
	for r := lo; r < hi; r++ {
		row := w[r*rowBytes : (r+1)*rowBytes]
		for j := 0; j < n; j++ {
			var acc float32
			for b := 0; b < nb; b++ {
				// Array pointers let the compiler drop bounds checks.
				blk := (*[weights.BlockBytesQ8_0]byte)(row[b*weights.BlockBytesQ8_0:])
				dw := tab[binary.LittleEndian.Uint16(blk[:])]
				xb := (*[weights.QK]int8)(xq.q[(j*nb+b)*weights.QK:])
				qs := (*[weights.QK]byte)(blk[2:])
				var s0, s1, s2, s3 int32
				for i := 0; i < weights.QK; i += 4 {
					s0 += int32(int8(qs[i])) * int32(xb[i])
					s1 += int32(int8(qs[i+1])) * int32(xb[i+1])
					s2 += int32(int8(qs[i+2])) * int32(xb[i+2])
					s3 += int32(int8(qs[i+3])) * int32(xb[i+3])
				}
				sum := s0 + s1 + s2 + s3
				acc += float32(float32(sum) * float32(dw*xq.d[j*nb+b]))
			}
			out[j*rows+r] = acc
		}
	}
}

func goMatMulQ4_0(out []float32, w []byte, rowBytes, lo, hi, rows, cols int, xq *quantized, n int) {
	tab := f16Table()
	nb := cols / weights.QK
	for r := lo; r < hi; r++ {
		row := w[r*rowBytes : (r+1)*rowBytes]
		for j := 0; j < n; j++ {
			var acc float32
			for b := 0; b < nb; b++ {
				blk := (*[weights.BlockBytesQ4_0]byte)(row[b*weights.BlockBytesQ4_0:])
				dw := tab[binary.LittleEndian.Uint16(blk[:])]
				xb := (*[weights.QK]int8)(xq.q[(j*nb+b)*weights.QK:])
				qs := (*[weights.QK / 2]byte)(blk[2:])
				// Σ (q-8)·x = Σ q·x - 8·Σ x
				var s0, s1 int32
				for i := 0; i < weights.QK/2; i += 2 {
					v0, v1 := qs[i], qs[i+1]
					s0 += int32(v0&15)*int32(xb[i]) + int32(v0>>4)*int32(xb[i+16])
					s1 += int32(v1&15)*int32(xb[i+1]) + int32(v1>>4)*int32(xb[i+17])
				}
				sum := s0 + s1
				g := 2 * (j*nb + b)
				sum -= 8 * (xq.s[g] + xq.s[g+1])
				acc += float32(float32(sum) * float32(dw*xq.d[j*nb+b]))
			}
			out[j*rows+r] = acc
		}
	}
}

// goMatMulQ4_K: per super-block, Σ_j sc_j·Σ q·x in integers, minus the
// offsets Σ_j m_j·(sum of x over sub-block j), then one float step.
func goMatMulQ4_K(out []float32, w []byte, rowBytes, lo, hi, rows, cols int, xq *quantized, n int) {
	tab := f16Table()
	nb := cols / weights.QKK
	for r := lo; r < hi; r++ {
		row := w[r*rowBytes : (r+1)*rowBytes]
		for j := 0; j < n; j++ {
			var acc float32
			for b := 0; b < nb; b++ {
				blk := row[b*weights.BlockBytesQ4_K : (b+1)*weights.BlockBytesQ4_K]
				d := tab[binary.LittleEndian.Uint16(blk[0:])]
				dmin := tab[binary.LittleEndian.Uint16(blk[2:])]
				scales := (*[12]byte)(blk[4:16])
				xb := xq.q[(j*nb+b)*weights.QKK:]
				bs := xq.s[(j*nb+b)*16:]
				var sumi, summ int32
				for sb := 0; sb < 8; sb++ {
					sc, m := weights.ScaleMinQ4_K(scales, sb)
					qs := blk[16+32*(sb/2) : 16+32*(sb/2)+32]
					shift := 4 * uint(sb&1)
					xs := xb[32*sb : 32*sb+32]
					var isum int32
					for l, v := range qs {
						isum += int32(v>>shift&15) * int32(xs[l])
					}
					sumi += int32(sc) * isum
					summ += int32(m) * (bs[2*sb] + bs[2*sb+1])
				}
				dx := xq.d[j*nb+b]
				acc += float32(float32(d*dx)*float32(sumi)) - float32(float32(dmin*dx)*float32(summ))
			}
			out[j*rows+r] = acc
		}
	}
}

// goMatMulQ6_K: levels 0..63 times x in integers per 16 values, less
// 32·(sum of x) for the level offset, scaled by the int8 sub-block scale.
func goMatMulQ6_K(out []float32, w []byte, rowBytes, lo, hi, rows, cols int, xq *quantized, n int) {
	tab := f16Table()
	nb := cols / weights.QKK
	for r := lo; r < hi; r++ {
		row := w[r*rowBytes : (r+1)*rowBytes]
		for j := 0; j < n; j++ {
			var acc float32
			for b := 0; b < nb; b++ {
				blk := row[b*weights.BlockBytesQ6_K : (b+1)*weights.BlockBytesQ6_K]
				d := tab[binary.LittleEndian.Uint16(blk[208:])]
				xb := xq.q[(j*nb+b)*weights.QKK:]
				bs := xq.s[(j*nb+b)*16:]
				var isum [16]int32
				for h := 0; h < 2; h++ {
					ql := blk[64*h : 64*h+64]
					qh := blk[128+32*h : 128+32*h+32]
					xh := xb[128*h:]
					g := isum[8*h:]
					for l := 0; l < 32; l++ {
						is := l / 16
						q1 := int32(ql[l]&15 | (qh[l]>>0&3)<<4)
						q2 := int32(ql[l+32]&15 | (qh[l]>>2&3)<<4)
						q3 := int32(ql[l]>>4 | (qh[l]>>4&3)<<4)
						q4 := int32(ql[l+32]>>4 | (qh[l]>>6&3)<<4)
						g[is] += q1 * int32(xh[l])
						g[is+2] += q2 * int32(xh[l+32])
						g[is+4] += q3 * int32(xh[l+64])
						g[is+6] += q4 * int32(xh[l+96])
					}
				}
				var sumi int32
				for i := 0; i < 16; i++ {
					sumi += int32(int8(blk[192+i])) * (isum[i] - 32*bs[i])
				}
				acc += float32(float32(d*xq.d[j*nb+b]) * float32(sumi))
			}
			out[j*rows+r] = acc
		}
	}
}

var rowScratch = sync.Pool{New: func() any { return new([]float32) }}

// goMatMulFloat decodes each weight row to float32 once and takes its dot
// product with every vector.
func goMatMulFloat(out []float32, w []byte, wt weights.DType, rowBytes, lo, hi, rows, cols int, x []float32, n int) {
	sp := rowScratch.Get().(*[]float32)
	defer rowScratch.Put(sp)
	*sp = growSlice(*sp, cols)
	buf := *sp
	for r := lo; r < hi; r++ {
		row := w[r*rowBytes : (r+1)*rowBytes]
		decodeRow(wt, row, buf)
		for j := 0; j < n; j++ {
			out[j*rows+r] = dot(buf, x[j*cols:(j+1)*cols])
		}
	}
}

// decodeRow turns one weight row into float32.
func decodeRow(wt weights.DType, row []byte, dst []float32) {
	switch wt {
	case weights.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:]))
		}
	case weights.F16:
		tab := f16Table()
		for i := range dst {
			dst[i] = tab[binary.LittleEndian.Uint16(row[2*i:])]
		}
	default:
		// BF16 and the K-quants: the reference decoders are exact.
		weights.Dequantize(wt, row, dst)
	}
}

// dot sums in four lanes (as the C kernels' SIMD lanes do) and then
// pairwise, which keeps float32 rounding error low on long rows.
func dot(a, b []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = weights.F16ToF32(uint16(i))
	}
	return &t
})
