package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
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

// claimedChunks is how many chunks runClaimed cuts n rows of a job of
// work multiply-adds into, on multiples of align, for each worker count
// the job may run on: each worker's share of a static split, cut into
// claimsFor chunks.
func claimedChunks(n, align int, work float64, workers []int) []int {
	var out []int
	units := (n + align - 1) / align
	for _, w := range workers {
		w = min(w, units)
		if w <= 1 {
			out = append(out, 1)
			continue
		}
		per, extra := units/w, units%w
		claims := claimsFor(work, w)
		rows := max(1, (per+claims-1)/claims) * align
		chunks, lo := 0, 0
		for i := range w {
			u := per
			if i < extra {
				u++
			}
			hi := min(n, lo+u*align)
			chunks += (hi - lo + rows - 1) / rows
			lo = hi
		}
		out = append(out, chunks)
	}
	return out
}

// TestRunJobWorkSizesTheSplit: a job below tuneFloor runs on the caller,
// one of tuneCeiling or more on every worker its row groups allow, one in
// between on one of the pool's worker counts; the workers claim chunks
// cut on multiples of the alignment, and each covers [0,n) exactly once.
func TestRunJobWorkSizesTheSplit(t *testing.T) {
	pool := NewPool(4)
	defer pool.Close()
	for _, tc := range []struct {
		work    float64
		n       int
		workers []int // the worker counts allowed
	}{
		{0, 64, []int{1}}, {tuneFloor - 1, 64, []int{1}},
		{tuneFloor, 64, []int{1, 2, 4}}, {tuneCeiling - 1, 64, []int{1, 2, 4}},
		{tuneCeiling, 64, []int{4}}, {1e12, 64, []int{4}}, {1e12, 1001, []int{4}},
		{1e12, 8, []int{2}}, // 8 rows in groups of 4: two workers at most
	} {
		chunks := claimedChunks(tc.n, 4, tc.work, tc.workers)
		for range 3 * warmTries * len(pool.tune.options) { // every option of a tuned size
			hits := make([]atomic.Int32, tc.n)
			var calls atomic.Int32
			pool.RunJobWork(tc.n, 4, tc.work, funcJob(func(lo, hi int) {
				calls.Add(1)
				if lo%4 != 0 || lo >= hi {
					t.Errorf("work %g: chunk [%d,%d) not on a group of 4", tc.work, lo, hi)
				}
				for i := lo; i < hi; i++ {
					hits[i].Add(1)
				}
			}))
			if got := int(calls.Load()); !slices.Contains(chunks, got) {
				t.Fatalf("work %g over %d rows: %d chunks, want one of %v (for %v workers)", tc.work, tc.n, got, chunks, tc.workers)
			}
			for i := range hits {
				if h := hits[i].Load(); h != 1 {
					t.Fatalf("work %g: index %d visited %d times", tc.work, i, h)
				}
			}
		}
	}
	if got := NewPool(6); !slices.Equal(got.tune.options, []int{1, 2, 4, 6}) {
		t.Errorf("a 6-thread pool chooses among %v worker counts, want [1 2 4 6]", got.tune.options)
	} else {
		got.Close()
	}
}

// unitsJob is a SizedJob that records the worker counts Units was given
// and the chunks it ran.
type unitsJob struct {
	workers []int
	chunks  atomic.Int32
}

func (j *unitsJob) Units(workers int) int { j.workers = append(j.workers, workers); return 64 }
func (j *unitsJob) Run(lo, hi int)        { j.chunks.Add(1) }

// TestRunSizedWorkSizesTheJobForItsWorkers: Units learns the worker
// count the job then runs on, before it is split.
func TestRunSizedWorkSizesTheJobForItsWorkers(t *testing.T) {
	pool := NewPool(4)
	defer pool.Close()
	for _, work := range []float64{tuneFloor - 1, tuneFloor, tuneCeiling / 2, tuneCeiling} {
		for range warmTries * len(pool.tune.options) {
			var j unitsJob
			pool.RunSizedWork(4, work, &j)
			if len(j.workers) != 1 || int(j.chunks.Load()) != claimedChunks(64, 4, work, j.workers)[0] {
				t.Fatalf("work %g: Units given %v, %d chunks run; want one count, and the chunks it cuts", work, j.workers, j.chunks.Load())
			}
		}
	}
}

// TestClaimedChunksBalanceASlowWorker: when one worker is held up, the
// others take what is left of its share. A static split would leave the
// held worker a quarter of the rows; here it keeps only the chunk it
// took first.
func TestClaimedChunksBalanceASlowWorker(t *testing.T) {
	pool := NewPool(4)
	defer pool.Close()
	const n = 256
	release := make(chan struct{})
	var held atomic.Bool
	var heldRows, rows atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		pool.RunJobWork(n, 1, 1e12, funcJob(func(lo, hi int) {
			rows.Add(int32(hi - lo))
			if held.CompareAndSwap(false, true) {
				// The first chunk claimed waits until every other row is done.
				heldRows.Store(int32(hi - lo))
				<-release
			}
		}))
	}()
	// A bound on liveness, not a timing: the free workers take the rows
	// at once, or never.
	for deadline := time.Now().Add(10 * time.Second); rows.Load() < n; runtime.Gosched() {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%d of %d rows done while one worker was held: no one took its share", rows.Load(), n)
		}
	}
	close(release)
	<-done
	want := int32(n / (4 * claimsPerWorker))
	if heldRows.Load() != want {
		t.Fatalf("the held chunk had %d rows, want %d: the rest went to the other workers", heldRows.Load(), want)
	}
}

// TestSplitTunerLearnsTheCheapestSplit drives a 4-thread pool's tuner
// with a clock that charges each call what k workers would cost: the work
// divided by k plus a hand-off for each worker beyond the caller. It
// must settle on the cheapest count for each hand-off cost, move when the
// host's hand-off changes under it, and once settled try the others
// seldom (a try can cost a parked worker's wake-up); the wake-up before a
// timed split is not part of its timing.
func TestSplitTunerLearnsTheCheapestSplit(t *testing.T) {
	const work = 1e5 // 10 µs on one thread at 0.1 ns per multiply-add
	tuner := newSplitTuner(4)
	var clock, handoff time.Duration
	tuner.now = func() time.Duration { return clock }
	// used runs calls and counts how many used each worker count.
	used := func(calls int) map[int]int {
		n := map[int]int{}
		for range calls {
			tuner.run(work, func(k int) {
				clock += 10*time.Microsecond/time.Duration(k) + handoff*time.Duration(k-1)
				n[k]++
			}, func(int) { clock += time.Millisecond }) // a wake-up, outside the timing or it would hide every split
		}
		return n
	}
	const settle, measure = 3 * exploreMax, 2000
	for _, step := range []struct {
		handoff time.Duration
		best    int // the cheapest count: 10/k + h(k-1) µs
	}{
		{6 * time.Microsecond, 1},  // 10, 11, 28 µs
		{500 * time.Nanosecond, 4}, // 10, 5.5, 4 µs
		{2 * time.Microsecond, 2},  // 10, 7, 8.5 µs
		{6 * time.Microsecond, 1},  // back
	} {
		handoff = step.handoff
		used(settle)
		if got := used(measure); got[step.best] < measure*99/100 {
			t.Errorf("hand-off %v: counts used %v in %d calls after %d to settle, want %d workers in at least 99%% of them", step.handoff, got, measure, settle, step.best)
		}
	}
}

// TestSplitTunerWarmUpKeepsTheFastestTry: a slow first try of the
// cheapest count (a preempted caller) must not hide it: the warm-up
// keeps each count's fastest try, so the first call after it uses the
// cheapest count, not one 64 calls later when it is tried again.
func TestSplitTunerWarmUpKeepsTheFastestTry(t *testing.T) {
	tuner := newSplitTuner(2) // counts 1 and 2
	var clock time.Duration
	tuner.now = func() time.Duration { return clock }
	splits := 0
	used := 0
	run := func() {
		tuner.run(1e5, func(k int) {
			used = k
			if k == 1 {
				clock += 10 * time.Microsecond
				return
			}
			if splits++; splits == 1 {
				clock += 100 * time.Microsecond // the slow first try
				return
			}
			clock += 6 * time.Microsecond
		}, func(int) {})
	}
	for range warmTries * len(tuner.options) {
		run()
	}
	run()
	if used != 2 {
		t.Errorf("the first call after the warm-up used %d workers, want 2 (6 µs against 10; only its first try was slow)", used)
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

// TestPinnedPool: a pinned pool's workers run on its CPUs only, it
// computes what an unpinned one does, parked pinned workers wake, and a
// set the process may not use is refused.
func TestPinnedPool(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "android" {
		if _, err := NewPinnedPool(2, cpuset.Set{0}); err == nil {
			t.Fatal("a pinned pool where pinning is not supported: no error")
		}
		return
	}
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	pin := cpuset.Set{allowed[len(allowed)-1]}
	p, err := NewPinnedPool(3, pin)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !slices.Equal(p.CPUs(), pin) || NewPool(1).CPUs() != nil {
		t.Fatalf("CPUs() = %v, want %v (and nil unpinned)", p.CPUs(), pin)
	}
	// Every chunk but the caller's (the last) runs on a worker: each
	// worker's thread reports the pinned set.
	for round := range 2 {
		var mu sync.Mutex
		seen := map[int]string{}
		p.Run(3, func(lo, hi int) {
			got, err := cpuset.Current()
			mu.Lock()
			defer mu.Unlock()
			seen[lo] = fmt.Sprint(got, err)
		})
		for lo := range 2 {
			if want := fmt.Sprint(pin, nil); seen[lo] != want {
				t.Errorf("round %d: chunk %d ran on %s, want %s", round, lo, seen[lo], want)
			}
		}
		if round == 0 { // the second round wakes parked workers
			for start := time.Now(); !p.workers[0].sleeping.Load() || !p.workers[1].sleeping.Load(); time.Sleep(time.Millisecond) {
				if time.Since(start) > 30*time.Second {
					t.Fatal("pinned workers never parked")
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, cols, n = 96, 64, 3
	w, _ := randomMatrix(t, rng, weights.F32, rows, cols)
	x := randomVector(rng, n*cols)
	got, want := make([]float32, n*rows), make([]float32, n*rows)
	if err := p.MatMul(got, w, weights.F32, rows, cols, x, n); err != nil {
		t.Fatal(err)
	}
	if err := NewPool(1).MatMul(want, w, weights.F32, rows, cols, x, n); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Error("a pinned pool's MatMul differs from one thread's")
	}
	if _, err := NewPinnedPool(2, cpuset.Set{allowed[len(allowed)-1] + 1}); err == nil {
		t.Error("pinning to a CPU the process may not use: no error")
	}
}
