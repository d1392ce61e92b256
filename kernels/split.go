package kernels

import (
	"math/bits"
	"time"
)

// Whether handing part of a job to a worker pays depends on the host,
// and on a VM on where the hypervisor has put the vCPUs at the moment:
// one 2-vCPU VM measured a no-op hand-off at 470 ns and, a quarter of an
// hour later, at 108 ns. A 192×192 Q8_0 matrix times one vector took
// 1.35 µs on one thread throughout, and 2.8 µs on two in the first spell,
// 1.0 µs in the second. No fixed threshold fits both, so a Pool times its
// own jobs and learns, for each size of job, how many workers to use.
//
// Jobs below tuneFloor multiply-adds always run on the caller (a hand-off
// costs more than their whole work on any host we have seen), and jobs
// of tuneCeiling or more always use every worker (tens of microseconds
// and up: the hand-off is noise). Between the two, sizes are grouped by
// powers of two.
const (
	tuneFloor   = 1 << 13
	tuneCeiling = 1 << 20
	tuneClasses = 21 // bits.Len64 of work below tuneCeiling
	maxOptions  = 8  // worker counts per pool: 1, 2, 4, ..., threads
	// warmTries is how often each worker count is timed before the best
	// is chosen; the fastest of them counts, as a parked worker's wake-up
	// or a preempted caller makes a call slow.
	warmTries = 3
	// A class times a worker count other than its best every so many
	// calls, so that it notices when the host's costs change: first after
	// exploreMin calls, and twice as long after each try that leaves the
	// best as it was, up to exploreMax. A try can cost far more than the
	// call (when the best is the caller alone the workers have parked, and
	// waking one takes tens of microseconds on a VM), so a settled class
	// tries seldom.
	exploreMin = 64
	exploreMax = 4096
	// timeEvery is how often a class times a call of its best worker
	// count. Reading the clock twice costs tens of nanoseconds, a tenth
	// of the smallest tuned job.
	timeEvery = 8
	// Noise only ever makes a job slower, so a timing below an option's
	// running cost replaces it, and one above moves it by tuneUp of the
	// difference, at most tuneClip times the cost: a one-off stall does
	// not hide an option for a period, and a host that got slower shows
	// within a few dozen calls.
	tuneUp   = 1.0 / 8
	tuneClip = 4
)

// splitTuner chooses a job's worker count by its measured cost. A Pool's
// caller is one goroutine at a time, so it needs no lock.
type splitTuner struct {
	options []int // worker counts to choose from, ascending
	classes [tuneClasses]tuneClass
	now     func() time.Duration // a monotonic clock; tests replace it
}

type tuneClass struct {
	cost     [maxOptions]float64 // running nanoseconds per multiply-add; 0 until timed
	tries    [maxOptions]uint32
	calls    uint32
	best     int
	explored uint32 // the tries of other counts than the best so far
	period   uint32 // calls between such tries (0: exploreMin)
	since    uint32 // calls since the last
}

func newSplitTuner(threads int) splitTuner {
	var opts []int
	for w := 1; w < threads && len(opts) < maxOptions-1; w *= 2 {
		opts = append(opts, w)
	}
	opts = append(opts, threads)
	start := time.Now()
	return splitTuner{options: opts, now: func() time.Duration { return time.Since(start) }}
}

// run calls split with the worker count jobs of work's size have been
// cheapest with, timing some calls to keep learning. Before a timed call
// with helpers it calls ready with the count, so that the timing is of
// helpers already running: a tuner that chose the caller alone leaves
// them parked, and timing their wake-ups (tens of microseconds against
// one or two for the job) made every later try of a split look dear, a
// trap the embedded model's decode fell into on a VM whose hand-off had
// become cheap again (143 µs a step, where splitting every matrix gave
// 111).
func (s *splitTuner) run(work float64, split, ready func(workers int)) {
	c := &s.classes[bits.Len64(uint64(work))]
	c.calls++
	c.since++
	i, timed, exploring := c.best, c.calls%timeEvery == 0, false
	// Every warm-up call is timed and tries the least tried count, so
	// the warm-up is the first warmTries calls per count.
	if c.calls <= uint32(warmTries*len(s.options)) {
		i, timed = c.leastTried(len(s.options)), true
	} else if c.since >= max(c.period, exploreMin) && len(s.options) > 1 {
		k := int(c.explored) % (len(s.options) - 1)
		i, timed, exploring = (c.best+1+k)%len(s.options), true, true // the others in turn
		c.explored++
		c.since = 0
	}
	if !timed {
		split(s.options[i])
		return
	}
	if s.options[i] > 1 {
		ready(s.options[i])
	}
	t0 := s.now()
	split(s.options[i])
	best := c.best
	c.observe(i, float64(s.now()-t0)/work)
	if exploring {
		c.period = max(c.period, exploreMin) * 2
		if c.best != best {
			c.period = exploreMin
		}
		c.period = min(c.period, exploreMax)
	}
}

// leastTried is the first of the n options timed the fewest times.
func (c *tuneClass) leastTried(n int) int {
	j := 0
	for i := 1; i < n; i++ {
		if c.tries[i] < c.tries[j] {
			j = i
		}
	}
	return j
}

// observe adds a timing of option i, in nanoseconds per multiply-add,
// and moves best to the cheapest option timed so far.
func (c *tuneClass) observe(i int, x float64) {
	switch {
	case c.tries[i] == 0 || x < c.cost[i]:
		c.cost[i] = x
	case c.tries[i] >= warmTries: // the warm-up keeps its fastest
		c.cost[i] += (min(x, tuneClip*c.cost[i]) - c.cost[i]) * tuneUp
	}
	c.tries[i]++
	if c.tries[c.best] == 0 {
		c.best = i
	}
	for j := range c.cost {
		if c.tries[j] > 0 && c.cost[j] < c.cost[c.best] {
			c.best = j
		}
	}
}
