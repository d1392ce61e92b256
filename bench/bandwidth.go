// Package bench holds tandem's benchmark workloads and the physical bounds
// they are reported against. Decode speed is bound by the bytes of weights
// read per token, so every figure here comes with bytes moved ÷ bandwidth
// measured in the same run.
package bench

import (
	"runtime"
	"slices"
	"sync"
	"time"
)

// Bandwidth is a measured memory bandwidth.
type Bandwidth struct {
	Threads     int
	BufferBytes int
	// BytesPerSec counts the bytes a copy reads plus the bytes it writes
	// (the STREAM convention), median over the runs.
	BytesPerSec float64
}

// MemoryBandwidth measures copy bandwidth with threads goroutines, each
// copying its own slice of a buffer far larger than the last-level cache.
// Decode streams every weight once per token, which is a read-dominated
// version of the same access pattern; a copy is the fastest thing Go can
// do with memory (memmove uses the widest vector moves), so it is an
// honest upper bound.
func MemoryBandwidth(threads, bufferBytes, runs int) Bandwidth {
	if threads < 1 {
		threads = 1
	}
	if runs < 1 {
		runs = 1
	}
	per := bufferBytes / threads
	src := make([][]byte, threads)
	dst := make([][]byte, threads)
	for i := range src {
		src[i] = make([]byte, per)
		dst[i] = make([]byte, per)
		for j := 0; j < per; j += 4096 { // touch every page before timing
			src[i][j] = byte(j)
			dst[i][j] = 1
		}
	}
	rates := make([]float64, 0, runs)
	for r := 0; r < runs; r++ {
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < threads; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				copy(dst[i], src[i])
			}(i)
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		rates = append(rates, float64(2*per*threads)/elapsed)
	}
	runtime.KeepAlive(dst)
	return Bandwidth{Threads: threads, BufferBytes: per * threads, BytesPerSec: Median(rates)}
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
