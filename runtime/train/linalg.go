package train

import (
	"fmt"
	"unsafe"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/weights"
)

// mm sets out (n×rows) = x (n×cols) · wᵀ for w of rows×cols, all row-major:
// out[j*rows+r] = Σ_c w[r*cols+c]·x[j*cols+c].
//
// float32 runs the kernels package's F32 matmul (C with AVX2/NEON in cgo
// builds), which is several times faster than a Go loop; float64 (the
// gradient checks) runs a plain Go loop. Every backward product is
// rewritten into this one form with transposes (see linear), so one
// matmul serves the whole trainer. Each output element is one dot product
// computed by one worker, so results do not depend on the thread count.
func mm[T Float](p *kernels.Pool, out, w, x []T, rows, cols, n int) {
	switch o := any(out).(type) {
	case []float32:
		wf := any(w).([]float32)
		if err := p.MatMul(o, f32Bytes(wf[:rows*cols]), weights.F32, rows, cols, any(x).([]float32), n); err != nil {
			// Shapes come from a validated Config: a failure is a bug.
			panic(fmt.Sprintf("train: matmul %dx%d by %d: %v", rows, cols, n, err))
		}
	default:
		p.Run(rows, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				wr := w[r*cols : (r+1)*cols]
				for j := 0; j < n; j++ {
					out[j*rows+r] = dot(wr, x[j*cols:(j+1)*cols])
				}
			}
		})
	}
}

// f32Bytes views float32 values as the little-endian bytes the F32 matmul
// reads (every platform tandem targets is little-endian), without a copy.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func dot[T Float](a, b []T) T {
	var s0, s1, s2, s3 T
	b = b[:len(a)]
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

// transpose sets dst (cols×rows) = srcᵀ for src of rows×cols. It moves
// 8×8 blocks through registers and walks a strip of 8 destination rows at
// a time: with power-of-two strides (2048 tokens, a 1024 vocabulary) the
// lines of a larger tile fall in one cache set and evict each other, which
// made 32×32 tiles four times slower (BenchmarkTranspose).
func transpose[T Float](p *kernels.Pool, dst, src []T, rows, cols int) {
	const b = 8
	strips := (cols + b - 1) / b
	run := func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c0 := s * b
			if c0+b > cols {
				for r := 0; r < rows; r++ {
					for c := c0; c < cols; c++ {
						dst[c*rows+r] = src[r*cols+c]
					}
				}
				continue
			}
			r := 0
			for ; r+b <= rows; r += b {
				var blk [b][b]T
				for i := range b {
					row := src[(r+i)*cols+c0 : (r+i)*cols+c0+b]
					for j := range b {
						blk[j][i] = row[j]
					}
				}
				for j := range b {
					copy(dst[(c0+j)*rows+r:(c0+j)*rows+r+b], blk[j][:])
				}
			}
			for ; r < rows; r++ {
				for c := c0; c < c0+b; c++ {
					dst[c*rows+r] = src[r*cols+c]
				}
			}
		}
	}
	if p == nil {
		run(0, strips)
		return
	}
	p.Run(strips, run)
}

// linear is y (n×out) = x (n×in) · Wᵀ, W of out×in (a GGUF matrix).
func linear[T Float](p *kernels.Pool, y, w, x []T, out, in, n int) {
	mm(p, y[:n*out], w, x[:n*in], out, in, n)
}

// scratch is a set of reusable buffers.
type scratch[T Float] struct{ bufs [][]T }

func (s *scratch[T]) get(i, n int) []T {
	for len(s.bufs) <= i {
		s.bufs = append(s.bufs, nil)
	}
	if cap(s.bufs[i]) < n {
		s.bufs[i] = make([]T, n)
	}
	return s.bufs[i][:n]
}

// linearGrad back-propagates y = x·Wᵀ: dx (n×in) = dy·W, set (or added
// when accumulate) and dW (out×in) = dyᵀ·x, set. xT is xᵀ (in×n) when the
// caller has it (an input shared by several matrices), else nil.
func linearGrad[T Float](p *kernels.Pool, sc *scratch[T], dx, dw, dy, w, x, xT []T, out, in, n int, accumulate bool) {
	if dx != nil {
		wT := sc.get(0, in*out)
		transpose(p, wT, w, out, in)
		if accumulate {
			tmp := sc.get(1, n*in)
			mm(p, tmp, wT, dy[:n*out], in, out, n)
			add(p, dx[:n*in], tmp)
		} else {
			mm(p, dx[:n*in], wT, dy[:n*out], in, out, n)
		}
	}
	if xT == nil {
		xT = sc.get(2, in*n)
		transpose(p, xT, x[:n*in], n, in)
	}
	dyT := sc.get(3, out*n)
	transpose(p, dyT, dy[:n*out], n, out)
	// dW[o][i] = Σ_t dy[t][o]·x[t][i]: rows are inputs (xᵀ), vectors are
	// outputs (dyᵀ), so the result lands in dW's own row-major layout.
	mm(p, dw[:out*in], xT, dyT, in, n, out)
}

// add sets dst += x.
func add[T Float](p *kernels.Pool, dst, x []T) {
	p.Run(len(dst), func(lo, hi int) {
		d, s := dst[lo:hi], x[lo:hi]
		for i := range d {
			d[i] += s[i]
		}
	})
}
