// Package bench holds tandem's benchmark workloads and the physical bounds
// they are reported against. Decode speed is bound by the bytes of weights
// read per token (memory) or by the arithmetic on them (compute), so every
// figure here comes with both bounds measured in the same run.
package bench

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/weights"
)

// Bandwidth is a measured memory read bandwidth.
type Bandwidth struct {
	Threads     int
	BufferBytes int
	// BytesPerSec counts bytes read (nothing is written), median over
	// the runs: what a matrix-vector product streaming its weights does.
	BytesPerSec float64
}

// MemoryBandwidth measures read bandwidth with threads goroutines, each
// summing its own slice of a buffer of bufferBytes (make it far larger
// than the last-level cache, as a model's weights are). Decode reads
// every weight once per token and writes next to nothing, so reads, not
// a copy's reads plus writes, are its bound.
func MemoryBandwidth(threads, bufferBytes, runs int) Bandwidth {
	threads, runs = max(threads, 1), max(runs, 1)
	per := bufferBytes / threads / 64 * 8 // uint64 words, a multiple of 8
	bufs := make([][]uint64, threads)
	for i := range bufs {
		bufs[i] = make([]uint64, per)
		for j := range bufs[i] { // fault every page in before timing
			bufs[i][j] = uint64(j)
		}
	}
	sums := make([]uint64, threads)
	rates := make([]float64, 0, runs)
	for r := 0; r < runs; r++ {
		var wg sync.WaitGroup
		start := time.Now()
		for i := range bufs {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				sums[i] = sumWords(bufs[i])
			}(i)
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		rates = append(rates, float64(8*per*threads)/elapsed)
	}
	runtime.KeepAlive(sums)
	return Bandwidth{Threads: threads, BufferBytes: 8 * per * threads, BytesPerSec: Median(rates)}
}

// sumWords reads every word with eight independent sums, so the loop is
// limited by loads, not by an addition chain.
func sumWords(b []uint64) uint64 {
	var s [8]uint64
	for i := 0; i+8 <= len(b); i += 8 {
		w := (*[8]uint64)(b[i:])
		s[0] += w[0]
		s[1] += w[1]
		s[2] += w[2]
		s[3] += w[3]
		s[4] += w[4]
		s[5] += w[5]
		s[6] += w[6]
		s[7] += w[7]
	}
	return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]
}

// KernelRate is the speed of tandem's own matrix-vector kernel on a
// weight matrix small enough to stay in cache: what decode would reach
// if memory cost nothing (the compute bound).
type KernelRate struct {
	Type    weights.DType
	Threads int
	// BytesPerSec is weight bytes multiplied per second (n = 1), median.
	BytesPerSec float64
}

// KernelPeak measures the n=1 matmul of type wt on a cache-resident
// matrix (rows×cols as decode's attention projections use) with pool's
// threads, the median of runs timings of repeated calls.
func KernelPeak(pool *kernels.Pool, wt weights.DType, rows, cols, runs int) (KernelRate, error) {
	rng := rand.New(rand.NewPCG(7, 8))
	vals := make([]float32, rows*cols)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		return KernelRate{}, err
	}
	w := make([]byte, int(rb)*rows)
	if err := weights.Quantize(wt, vals, w); err != nil {
		return KernelRate{}, err
	}
	x, out := vals[:cols], make([]float32, rows)
	// Calls per timing: about 40 MiB of weights, at most 1000 calls (a
	// tiny matrix would time the pool's dispatch, not the kernel).
	calls := min(1000, max(1, 40<<20/len(w)))
	if err := pool.MatMul(out, w, wt, rows, cols, x, 1); err != nil { // warm the cache
		return KernelRate{}, err
	}
	rates := make([]float64, 0, runs)
	for r := 0; r < max(runs, 1); r++ {
		start := time.Now()
		for i := 0; i < calls; i++ {
			if err := pool.MatMul(out, w, wt, rows, cols, x, 1); err != nil {
				return KernelRate{}, err
			}
		}
		rates = append(rates, float64(calls*len(w))/time.Since(start).Seconds())
	}
	return KernelRate{Type: wt, Threads: pool.Threads(), BytesPerSec: Median(rates)}, nil
}

// Median returns the median of xs (0 for none); xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
