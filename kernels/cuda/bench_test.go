//go:build cuda

package cuda

import (
	"fmt"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

// BenchmarkCopy measures the device's memory bandwidth, counting the
// bytes read and written by a 1 GiB device-to-device copy: the bound the
// matmul figures are compared with.
func BenchmarkCopy(b *testing.B) {
	s := benchStream(b)
	const size = 1 << 30
	src, dst := benchAlloc(b, s, size), benchAlloc(b, s, size)
	b.SetBytes(2 * size)
	b.ResetTimer()
	// b.N, not b.Loop: the Sync that waits for the queued work must be
	// inside the timed region.
	for i := 0; i < b.N; i++ {
		if err := s.Copy(dst, src); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMatMul multiplies 7B-sized matrices (4096×4096 attention,
// 11008×4096 FFN) by 1 vector (decode) and 8 (a small tree), reporting
// the weight bytes read per second: decode is bound by them.
func BenchmarkMatMul(b *testing.B) {
	s := benchStream(b)
	for _, wt := range []weights.DType{weights.Q4_0, weights.Q8_0, weights.F16} {
		for _, shape := range [][2]int{{4096, 4096}, {11008, 4096}} {
			rows, cols := shape[0], shape[1]
			rb, _ := wt.RowBytes(uint64(cols))
			wBytes := int64(rb) * int64(rows)
			w := benchAlloc(b, s, wBytes)
			for _, n := range []int{1, 8} {
				x := benchAlloc(b, s, int64(n*cols*4))
				out := benchAlloc(b, s, int64(n*rows*4))
				// Weights of all zero bytes are valid blocks of every type.
				b.Run(fmt.Sprintf("%s/%dx%d/n=%d", wt, rows, cols, n), func(b *testing.B) {
					b.SetBytes(wBytes)
					for i := 0; i < b.N; i++ {
						if err := s.MatMul(out, w, wt, rows, cols, x, n); err != nil {
							b.Fatal(err)
						}
					}
					if err := s.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

func benchStream(b *testing.B) *Stream {
	d, err := Open(0)
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close(); d.Close() })
	return s
}

// benchAlloc returns zeroed device memory freed with the benchmark.
func benchAlloc(b *testing.B, s *Stream, n int64) Buffer {
	buf, err := s.Device().Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Device().Free(buf) })
	zero := make([]byte, min(n, 64<<20))
	for off := int64(0); off < n; off += int64(len(zero)) {
		chunk := min(int64(len(zero)), n-off)
		if err := s.Upload(buf.Slice(off, chunk), zero[:chunk]); err != nil {
			b.Fatal(err)
		}
	}
	return buf
}
