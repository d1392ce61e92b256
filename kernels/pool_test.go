package kernels

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/weights"
)

// Run covers [0,n) exactly once, in contiguous chunks, for any n and
// thread count, and RunAligned cuts only at multiples of align.
func TestPoolRun(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		pool := NewPool(threads)
		if pool.Threads() != threads {
			t.Fatalf("Threads() = %d, want %d", pool.Threads(), threads)
		}
		for _, n := range []int{0, 1, 2, 5, 100, 1001} {
			for _, align := range []int{1, 4} {
				t.Run(fmt.Sprintf("threads=%d/n=%d/align=%d", threads, n, align), func(t *testing.T) {
					hits := make([]atomic.Int32, n)
					var calls atomic.Int32
					pool.RunAligned(n, align, func(lo, hi int) {
						calls.Add(1)
						if lo%align != 0 || lo >= hi {
							t.Errorf("chunk [%d,%d) with align %d", lo, hi, align)
						}
						for i := lo; i < hi; i++ {
							hits[i].Add(1)
						}
					})
					for i := range hits {
						if h := hits[i].Load(); h != 1 {
							t.Fatalf("index %d visited %d times", i, h)
						}
					}
					if int(calls.Load()) > threads {
						t.Fatalf("%d chunks for %d threads", calls.Load(), threads)
					}
				})
			}
		}
		pool.Close()
		pool.Close() // idempotent
	}
	if p := NewPool(0); p.Threads() < 1 {
		t.Fatalf("default pool has %d threads", p.Threads())
	} else {
		p.Close()
	}
}

// TestRunJobWorkSizesTheSplit: a job gets one worker per minWork of its
// work, at most the pool's threads, and still covers [0,n) exactly once.
func TestRunJobWorkSizesTheSplit(t *testing.T) {
	pool := NewPool(4)
	defer pool.Close()
	for _, tc := range []struct {
		work   float64
		n      int
		chunks int
	}{
		{0, 64, 1}, {minWork - 1, 64, 1}, {2*minWork - 1, 64, 1}, {2 * minWork, 64, 2},
		{3.5 * minWork, 64, 3}, {1e12, 64, 4}, {1e12, 8, 2}, // 8 rows in groups of 4: two chunks at most
	} {
		hits := make([]atomic.Int32, tc.n)
		var calls atomic.Int32
		pool.RunJobWork(tc.n, 4, tc.work, funcJob(func(lo, hi int) {
			calls.Add(1)
			for i := lo; i < hi; i++ {
				hits[i].Add(1)
			}
		}))
		if got := int(calls.Load()); got != tc.chunks {
			t.Errorf("work %g over %d rows: %d chunks, want %d", tc.work, tc.n, got, tc.chunks)
		}
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Fatalf("work %g: index %d visited %d times", tc.work, i, h)
			}
		}
	}
}

// TestPoolWakesParkedWorkers: workers that spun out and parked take the
// next task (no lost wake-up), and Close ends parked workers.
func TestPoolWakesParkedWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	p := NewPool(3)
	// waitFor polls a state change; the 30 s cap only turns a hang into
	// a failure, it times nothing.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for start := time.Now(); !ok(); time.Sleep(time.Millisecond) {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("still waiting for %s", what)
			}
		}
	}
	parked := func() bool {
		for _, w := range p.workers {
			if !w.sleeping.Load() {
				return false
			}
		}
		return true
	}
	for round := 0; round < 3; round++ {
		waitFor("the workers to park", parked)
		var covered atomic.Int64
		p.Run(300, func(lo, hi int) { covered.Add(int64(hi - lo)) })
		if covered.Load() != 300 {
			t.Fatalf("round %d: covered %d of 300", round, covered.Load())
		}
	}
	waitFor("the workers to park", parked)
	p.Close()
	waitFor("the workers to exit", func() bool { return runtime.NumGoroutine() <= before })
}

// FuzzMatMulArgs: any argument combination returns an error or runs
// inside the slices; it never panics or reads out of bounds.
func FuzzMatMulArgs(f *testing.F) {
	f.Add(uint32(2), 3, 64, 1, 3*36, 64, 3)
	f.Add(uint32(12), 1, 256, 2, 144, 512, 2)
	f.Add(uint32(0), 2, 5, 3, 40, 15, 6)
	f.Add(uint32(14), 1, 256, 1, 209, 256, 1)
	f.Add(uint32(30), 0, 5, 1, 10, 5, 0)
	f.Add(uint32(0), 1<<31, 1<<33, 1<<31, 8, 8, 8) // products overflow int64
	pool := NewPool(2)
	f.Fuzz(func(t *testing.T, wt uint32, rows, cols, n, wLen, xLen, outLen int) {
		if wLen < 0 || xLen < 0 || outLen < 0 || wLen > 1<<20 || xLen > 1<<18 || outLen > 1<<18 {
			return
		}
		w := make([]byte, wLen)
		for i := range w {
			w[i] = byte(i * 7)
		}
		x := make([]float32, xLen)
		for i := range x {
			x[i] = float32(i%13) - 6
		}
		out := make([]float32, outLen)
		err := pool.MatMul(out, w, weights.DType(wt), rows, cols, x, n)
		if err == nil && (rows <= 0 || cols <= 0 || n <= 0 || n*rows > outLen || n*cols > xLen) {
			t.Fatalf("accepted rows %d cols %d n %d with out %d x %d", rows, cols, n, outLen, xLen)
		}
	})
}
