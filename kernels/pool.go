// Package kernels holds tandem's numeric kernels: matrix × batch of
// vectors for every weight type, RMSNorm, RoPE, softmax, SiLU×gate and
// attention over a KV cache. Every entry point has a pure-Go
// implementation, always compiled (Android builds run without cgo), and
// a C11 one used when cgo is enabled; SetBackend switches between them
// so tests can hold each against the other.
package kernels

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
)

// Pool runs kernels on a fixed set of worker goroutines. A Pool is used
// by one caller at a time (the model's Forward); Run is not reentrant.
//
// A decode step hands the workers a few hundred short tasks (one per
// matrix, tens of microseconds each), so handing over must cost far less
// than that: waking a parked goroutine costs tens to hundreds of
// microseconds on a VM. Workers therefore spin for a while after each
// task before they park (spinFor, spinLoads), and the caller spins for
// their results (waitLoads). A job too small to pay for a hand-off runs
// on the caller alone, and one in between gets the worker count jobs of
// its size have been fastest with (RunJobWork).
type Pool struct {
	threads int
	cpus    cpuset.Set // the CPUs its workers are pinned to, or nil
	workers []*worker
	once    sync.Once
	mm      matmulJob // MatMul's arguments (one caller at a time)
	// runClaimed's state, one per worker where it has one
	claim    claimJob
	shares   []claimShare
	claimers []claimer
	tune     splitTuner // how many workers a job of each size gets
}

// A Job is work a Pool splits over row ranges. A pointer to a Job kept
// in a long-lived struct costs no allocation per call, where a closure
// handed to Run is allocated on the heap each time (the workers keep it):
// hot paths (a decode step runs hundreds of kernels) use Jobs so that
// decoding does not feed the garbage collector.
type Job interface {
	Run(lo, hi int)
}

// funcJob lets Run take a plain function.
type funcJob func(lo, hi int)

func (f funcJob) Run(lo, hi int) { f(lo, hi) }

type task struct {
	lo, hi int
	job    Job
}

// worker is one goroutine's mailbox. Run writes t, then bumps seq; the
// worker runs t and stores seq into done.
type worker struct {
	t        task
	seq      atomic.Uint64
	done     atomic.Uint64
	sleeping atomic.Bool // set under park; readyWorkers reads it without, as a hint
	closed   atomic.Bool
	// park guards parking: a worker checks seq and waits on wake under
	// it, and post signals under it. A flag and a token channel instead
	// (the worker set the flag and then read seq, post bumped seq and then
	// read the flag) needed those two stores ordered before the loads
	// that follow them; the arm64 tests under qemu once hung there, the
	// worker parked with a task posted.
	park sync.Mutex
	wake *sync.Cond
	// pinned: the worker's goroutine is locked to a thread pinned to
	// CPUs. It spins without yielding: a locked goroutine that yields
	// hands its thread's processor over and waits to get it back, 20-40
	// µs on a VM, where an unlocked one resumes at once.
	pinned bool
}

// spinFor bounds a worker's spin between tasks: far longer than the gap
// between a forward pass's tasks, far shorter than an idle pool's life.
const spinFor = time.Millisecond

// spinLoads is how many times a spinning goroutine reads its mailbox
// between yields (runtime.Gosched), some ten microseconds. Yielding on
// every read, as the pool first did, took the Go scheduler's global lock
// a few times a microsecond from each spinning thread, and that lock
// traffic cost more than the work: the embedded model decoded slower on
// two threads than on one.
const spinLoads = 10000

// waitLoads bounds the caller's plain spin for a worker's result, about a
// microsecond, before it yields on every read. A small task's result is
// that close; a large one's is not, and a caller reading in a tight loop
// meanwhile slowed the worker's half of a memory-bound matrix by a third
// (F16 2048×5632 on two threads).
const waitLoads = 1000

// MaxThreads bounds the threads the tools and the scheduler's lanes accept:
// more is a typo, not a machine, and every worker spins while it waits.
const MaxThreads = 256

// NewPool starts threads workers (the caller's goroutine is one of them).
// threads <= 0 means DefaultThreads.
func NewPool(threads int) *Pool {
	p, _ := newPool(threads, nil)
	return p
}

// NewPinnedPool is NewPool with every worker's thread pinned to cpus (a
// phone's big or little cores): the pool computes there and nowhere
// else. The caller's goroutine, which runs a share of every job, pins
// itself (runtime.LockOSThread, then cpuset.Pin); the scheduler's lane
// goroutines do. It fails when a thread cannot be pinned.
func NewPinnedPool(threads int, cpus cpuset.Set) (*Pool, error) {
	if err := cpuset.Check(cpus); err != nil {
		return nil, err
	}
	return newPool(threads, cpus)
}

func newPool(threads int, cpus cpuset.Set) (*Pool, error) {
	if threads <= 0 {
		threads = DefaultThreads()
	}
	p := &Pool{threads: threads, cpus: cpus, workers: make([]*worker, threads-1), tune: newSplitTuner(threads),
		shares: make([]claimShare, threads), claimers: make([]claimer, threads)}
	started := make(chan error, len(p.workers))
	for i := range p.workers {
		w := &worker{pinned: cpus != nil}
		w.wake = sync.NewCond(&w.park)
		p.workers[i] = w
		go w.loop(cpus, started)
	}
	var errs []error
	for range p.workers {
		errs = append(errs, <-started)
	}
	if err := errors.Join(errs...); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// CPUs is the set the pool's threads are pinned to, or nil.
func (p *Pool) CPUs() cpuset.Set { return p.cpus }

func (w *worker) loop(cpus cpuset.Set, started chan<- error) {
	if cpus != nil {
		// Never unlocked: the pinned thread exits with the worker rather
		// than go back to run other goroutines.
		runtime.LockOSThread()
		if err := cpuset.Pin(cpus); err != nil {
			started <- err
			return
		}
	}
	started <- nil
	var last uint64
	for {
		if !w.await(last) {
			return
		}
		last = w.seq.Load()
		w.t.job.Run(w.t.lo, w.t.hi)
		w.t = task{}
		w.done.Store(last)
	}
}

// await waits until seq moves past last (true) or the pool closes
// (false): spinning first, then parked on wake.
func (w *worker) await(last uint64) bool {
	var start time.Time // read once a round of loads found nothing: most tasks come sooner
	for {
		for range spinLoads {
			if w.seq.Load() != last {
				return true
			}
		}
		if w.closed.Load() {
			return false
		}
		if start.IsZero() {
			start = time.Now()
		} else if time.Since(start) > spinFor {
			break
		}
		if !w.pinned {
			runtime.Gosched()
		}
	}
	w.park.Lock()
	defer w.park.Unlock()
	w.sleeping.Store(true)
	defer w.sleeping.Store(false)
	for w.seq.Load() == last {
		if w.closed.Load() {
			return false
		}
		w.wake.Wait()
	}
	return true
}

// post hands t to the worker.
func (w *worker) post(t task) {
	w.t = t
	w.seq.Add(1)
	// Always under park, however likely the worker is spinning: an
	// uncontended lock costs tens of nanoseconds, a lost wake-up a hang.
	w.park.Lock()
	w.wake.Signal()
	w.park.Unlock()
}

// wait returns when the worker has finished its latest task.
func (w *worker) wait() {
	want := w.seq.Load()
	for range waitLoads {
		if w.done.Load() == want {
			return
		}
	}
	for w.done.Load() != want {
		if !w.pinned { // the caller of a pinned pool is pinned too
			runtime.Gosched()
		}
	}
}

// Threads is the number of workers.
func (p *Pool) Threads() int { return p.threads }

// Close stops the workers. The Pool must not be used afterwards.
func (p *Pool) Close() {
	p.once.Do(func() {
		for _, w := range p.workers {
			w.closed.Store(true)
			w.park.Lock()
			w.wake.Signal()
			w.park.Unlock()
		}
	})
}

// Run calls fn over [0,n) split into contiguous, nearly equal chunks, one
// per worker, and waits for all of them. The split depends only on n and
// the thread count, so results are deterministic.
func (p *Pool) Run(n int, fn func(lo, hi int)) {
	p.RunJob(n, 1, funcJob(fn))
}

// RunAligned is Run with chunk boundaries on multiples of align (the last
// chunk takes the remainder), for kernels that work on groups of rows.
func (p *Pool) RunAligned(n, align int, fn func(lo, hi int)) {
	p.RunJob(n, align, funcJob(fn))
}

// RunJob is RunAligned for a Job.
func (p *Pool) RunJob(n, align int, job Job) { p.runJob(n, align, p.threads, job) }

// RunJobWork is RunJob for a job of about work multiply-adds in all. It
// runs a small job on the caller, a large one on every worker, and one in
// between on the worker count that jobs of its size have been fastest
// with on this host (splitTuner). A large job's workers finish each
// other's shares when one falls behind (runClaimed), so the job's rows
// must not depend on each other: the split never changes a result.
func (p *Pool) RunJobWork(n, align int, work float64, job Job) {
	p.byWork(work, func(workers int) { p.runClaimed(n, align, workers, claimsFor(work, workers), job) })
}

// A SizedJob is a Job whose units depend on how many workers run it:
// Units is called with that count before the job is split, and returns
// n for [0,n). Attention cuts its head groups finer only when a second
// worker will take part: cut for two threads, one thread made twice the
// kernel calls, and the embedded model decoded 15-20% slower on a
// two-thread pool that split nothing than on one thread.
type SizedJob interface {
	Job
	Units(workers int) int
}

// RunSizedWork is RunJobWork for a SizedJob.
func (p *Pool) RunSizedWork(align int, work float64, job SizedJob) {
	p.byWork(work, func(workers int) {
		p.runClaimed(job.Units(workers), align, workers, claimsFor(work, workers), job)
	})
}

// byWork calls run with the worker count for a job of work multiply-adds.
func (p *Pool) byWork(work float64, run func(workers int)) {
	switch {
	case p.threads == 1 || work < tuneFloor:
		run(1)
	case work >= tuneCeiling:
		run(p.threads)
	default:
		p.tune.run(work, run, p.readyWorkers)
	}
}

// noJob is the empty task readyWorkers hands a parked worker.
var noJob Job = funcJob(func(int, int) {})

// readyWorkers readies the first workers-1 workers: a parked one gets an
// empty task, and readyWorkers returns once each has run it.
func (p *Pool) readyWorkers(workers int) {
	ws := p.workers[:min(workers-1, len(p.workers))]
	for _, w := range ws {
		if w.sleeping.Load() {
			w.post(task{job: noJob})
		}
	}
	for _, w := range ws {
		w.wait()
	}
}

func (p *Pool) runJob(n, align, threads int, job Job) {
	if n <= 0 {
		return
	}
	units := (n + align - 1) / align
	workers := min(threads, units)
	if workers <= 1 {
		job.Run(0, n)
		return
	}
	for w := 0; w < workers-1; w++ {
		lo, hi := share(w, n, align, workers)
		p.workers[w].post(task{lo: lo, hi: hi, job: job})
	}
	job.Run(share(workers-1, n, align, workers))
	for w := 0; w < workers-1; w++ {
		p.workers[w].wait()
	}
}

// share is worker w's rows [lo,hi) of n, when their groups of align are
// split as evenly as they go over workers (the first ones one group more).
func share(w, n, align, workers int) (lo, hi int) {
	units := (n + align - 1) / align
	per, extra := units/workers, units%workers
	lo = (w*per + min(w, extra)) * align
	if w < extra {
		per++
	}
	return lo, min(n, lo+per*align)
}

// claimsPerWorker is how many chunks runClaimed cuts each worker's share
// of a large job into: enough that a worker set aside by the OS, or given
// costlier rows (a causal prefill's last tokens attend to the most),
// leaves part of its share to the others. claimWork keeps chunks to
// 1<<18 multiply-adds or more (some ten microseconds): each chunk is a
// kernel call, and cutting stories260K's small matrices in four made its
// 8-sequence step on two threads a third slower.
const (
	claimsPerWorker = 4
	claimWork       = 1 << 18
)

// claimsFor is how many chunks each of workers gets of a job of work
// multiply-adds.
func claimsFor(work float64, workers int) int {
	return int(min(claimsPerWorker, max(1, work/float64(workers)/claimWork)))
}

// claimJob runs a job's rows in shares, one per worker, as a static split
// would; a worker claims its own share's chunks first and then the
// chunks left in the others'. While the workers keep pace each computes
// the rows a static split gives it, so weights that fit in a core's cache
// stay in the cache of the core that read them last step, and no two
// workers claim from one counter; when one falls behind, the others
// finish its share.
type claimJob struct {
	job       Job
	chunkRows int64
	shares    []claimShare
}

// claimShare is one worker's rows. Each sits on its own cache lines: a
// worker claiming from its own share then touches no line another writes.
type claimShare struct {
	next atomic.Int64 // the first row not yet claimed
	end  int64
	_    [112]byte
}

// claimer runs a claimJob starting from one share.
type claimer struct {
	c     *claimJob
	share int
}

func (w *claimer) Run(int, int) {
	c := w.c
	for i := range c.shares {
		sh := &c.shares[(w.share+i)%len(c.shares)]
		for {
			hi := sh.next.Add(c.chunkRows)
			lo := hi - c.chunkRows
			if lo >= sh.end {
				break
			}
			c.job.Run(int(lo), int(min(hi, sh.end)))
		}
	}
}

// runClaimed runs job over [0,n) on threads workers in runJob's shares,
// each cut into claims chunks on multiples of align that idle workers may
// claim: a static split waits for its slowest share, and on a shared host
// or a phone's mixed cores one is often late. With one claim a share it
// is runJob.
func (p *Pool) runClaimed(n, align, threads, claims int, job Job) {
	units := (n + align - 1) / align
	workers := min(threads, units)
	if workers <= 1 || claims <= 1 {
		p.runJob(n, align, workers, job)
		return
	}
	c := &p.claim
	c.job = job
	c.shares = p.shares[:workers]
	per := units / workers
	c.chunkRows = int64(max(1, (per+claims-1)/claims) * align)
	for w := range workers {
		lo, hi := share(w, n, align, workers)
		c.shares[w].next.Store(int64(lo))
		c.shares[w].end = int64(hi)
	}
	for w := 0; w < workers-1; w++ {
		p.claimers[w] = claimer{c: c, share: w}
		p.workers[w].post(task{job: &p.claimers[w]})
	}
	p.claimers[workers-1] = claimer{c: c, share: workers - 1}
	p.claimers[workers-1].Run(0, 0)
	for w := 0; w < workers-1; w++ {
		p.workers[w].wait()
	}
	c.job = nil // drop the reference to the caller's job
}

// PhysicalCores counts physical cores on Linux (SMT siblings share a
// core_id within a package); elsewhere it is runtime.NumCPU.
func PhysicalCores() int {
	cpus := make(cpuset.Set, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	return physicalCoresAt(cpuset.SysCPU, cpus)
}

// physicalCoresAt counts the physical cores among cpus, as the sysfs CPU
// directory dir describes them; len(cpus) where it does not.
func physicalCoresAt(dir string, cpus cpuset.Set) int {
	seen := map[string]bool{}
	for _, cpu := range cpus {
		topo := dir + "/cpu" + strconv.Itoa(cpu) + "/topology/"
		core, err1 := os.ReadFile(topo + "core_id")
		pkg, err2 := os.ReadFile(topo + "physical_package_id")
		if err1 != nil || err2 != nil {
			return len(cpus)
		}
		seen[strings.TrimSpace(string(pkg))+"/"+strings.TrimSpace(string(core))] = true
	}
	if len(seen) == 0 || len(seen) > len(cpus) {
		return len(cpus)
	}
	return len(seen)
}

// DefaultThreads is the thread count a pool gets when none is asked for
// (NewPool(0); serve's and the mobile engine's default lane): the
// physical cores, or, on a machine whose cores differ (a phone's big and
// little ones), those of the fastest clusters that, counted at the
// slowest of them's speed, compute the most. A small kernel's rows are
// split evenly over its threads, so it waits for its slowest thread: with
// 4 big cores and 4 little ones at a third of their speed, 4 threads
// finish such a step in two thirds of the time 8 take. (Large kernels'
// idle threads take over the slow ones' chunks, runClaimed, but a decode
// step is mostly small kernels.)
func DefaultThreads() int {
	allowed, err := cpuset.Allowed()
	if err != nil {
		return PhysicalCores()
	}
	return defaultThreadsAt(cpuset.SysCPU, allowed, PhysicalCores())
}

// defaultThreadsAt is DefaultThreads over the sysfs CPU directory dir,
// counting only the CPUs in allowed, with physical the answer for
// alike cores.
func defaultThreadsAt(dir string, allowed cpuset.Set, physical int) int {
	t, err := cpuset.ClustersAt(dir)
	if err != nil || len(t) < 2 {
		return physical
	}
	best, bestWork := physical, 0
	var cpus cpuset.Set
	for _, c := range t { // fastest first
		for _, cpu := range c.CPUs {
			if allowed.Has(cpu) {
				cpus = append(cpus, cpu)
			}
		}
		if len(cpus) == 0 {
			continue
		}
		n := physicalCoresAt(dir, cpus)
		if work := n * c.Capacity; work > bestWork {
			best, bestWork = n, work
		}
	}
	return best
}
