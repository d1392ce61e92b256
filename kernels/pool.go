// Package kernels holds tandem's numeric kernels: matrix × batch of
// vectors for every weight type, RMSNorm, RoPE, softmax, SiLU×gate and
// attention over a KV cache. Every entry point has a pure-Go
// implementation, always compiled (Android builds run without cgo), and
// a C11 one used when cgo is enabled; SetBackend switches between them
// so tests can hold each against the other.
package kernels

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// Pool runs kernels on a fixed set of worker goroutines. A Pool is used
// by one caller at a time (the model's Forward); Run is not reentrant.
type Pool struct {
	threads int
	work    []chan task
	wg      sync.WaitGroup
	once    sync.Once
}

type task struct {
	lo, hi int
	fn     func(lo, hi int)
}

// NewPool starts threads workers (the caller's goroutine is one of them).
// threads <= 0 means the number of physical cores.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = PhysicalCores()
	}
	p := &Pool{threads: threads, work: make([]chan task, threads-1)}
	for i := range p.work {
		ch := make(chan task, 1)
		p.work[i] = ch
		go func() {
			for t := range ch {
				t.fn(t.lo, t.hi)
				p.wg.Done()
			}
		}()
	}
	return p
}

// Threads is the number of workers.
func (p *Pool) Threads() int { return p.threads }

// Close stops the workers. The Pool must not be used afterwards.
func (p *Pool) Close() {
	p.once.Do(func() {
		for _, ch := range p.work {
			close(ch)
		}
	})
}

// Run calls fn over [0,n) split into contiguous, nearly equal chunks, one
// per worker, and waits for all of them. The split depends only on n and
// the thread count, so results are deterministic.
func (p *Pool) Run(n int, fn func(lo, hi int)) {
	p.RunAligned(n, 1, fn)
}

// RunAligned is Run with chunk boundaries on multiples of align (the last
// chunk takes the remainder), for kernels that work on groups of rows.
func (p *Pool) RunAligned(n, align int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	units := (n + align - 1) / align
	workers := min(p.threads, units)
	if workers <= 1 {
		fn(0, n)
		return
	}
	per, extra := units/workers, units%workers
	lo := 0
	var mine task
	p.wg.Add(workers - 1)
	for w := 0; w < workers; w++ {
		u := per
		if w < extra {
			u++
		}
		hi := min(n, lo+u*align)
		t := task{lo: lo, hi: hi, fn: fn}
		if w == workers-1 {
			mine = t
		} else {
			p.work[w] <- t
		}
		lo = hi
	}
	mine.fn(mine.lo, mine.hi)
	p.wg.Wait()
}

// PhysicalCores counts physical cores on Linux (SMT siblings share a
// core_id within a package); elsewhere it is runtime.NumCPU.
func PhysicalCores() int {
	n := runtime.NumCPU()
	seen := map[string]bool{}
	for cpu := 0; cpu < n; cpu++ {
		dir := "/sys/devices/system/cpu/cpu" + strconv.Itoa(cpu) + "/topology/"
		core, err1 := os.ReadFile(dir + "core_id")
		pkg, err2 := os.ReadFile(dir + "physical_package_id")
		if err1 != nil || err2 != nil {
			return n
		}
		seen[strings.TrimSpace(string(pkg))+"/"+strings.TrimSpace(string(core))] = true
	}
	if len(seen) == 0 || len(seen) > n {
		return n
	}
	return len(seen)
}
