package sched

import (
	"math"
	"time"
)

// offeredLoad tracks the work arriving: the predicted tokens of new
// requests (and resumed segments), summed with exponential decay so the
// sum over one window is the recent arrival rate times the window.
type offeredLoad struct {
	sum float64
	at  time.Time
}

// add records tokens of new work arriving at now.
func (o *offeredLoad) add(tokens float64, now time.Time, window time.Duration) {
	o.sum = o.decayed(now, window) + tokens
	o.at = now
}

func (o *offeredLoad) decayed(now time.Time, window time.Duration) float64 {
	if o.at.IsZero() || window <= 0 {
		return o.sum
	}
	return o.sum * math.Exp(-max(now.Sub(o.at), 0).Seconds()/window.Seconds())
}

// rate is the recent arrival rate in tokens per second.
func (o *offeredLoad) rate(now time.Time, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return o.decayed(now, window) / window.Seconds()
}

// loadWindow is the time the offered load is averaged over: shedHorizon
// full-batch steps of the first lane, long enough that a burst does not
// read as overload.
func (s *Scheduler) loadWindow() time.Duration {
	return shedHorizon * s.lanes[0].cost.step(s.cfg.MaxBatch, 0)
}

// capacity is what the lanes decode at full batch, in tokens per second,
// at their measured step costs.
func (s *Scheduler) capacity() float64 {
	total := 0.0
	for _, l := range s.lanes {
		total += l.cost.rate(s.cfg.MaxBatch)
	}
	return total
}

// offeredRatio is the recent arrival rate over the lanes' capacity: above
// 1 the queues only grow, whatever the order they are served in.
func (s *Scheduler) offeredRatio(now time.Time) float64 {
	c := s.capacity()
	if c <= 0 {
		return 0
	}
	return s.offered.rate(now, s.loadWindow()) / c
}

// recentDeadlines remembers the time per token that recent requests with
// deadlines can afford (relative deadline ÷ predicted tokens), so a lane
// keeps its batch small enough for the next such request before it
// arrives.
type recentDeadlines struct {
	per  [16]time.Duration
	at   [16]int64 // UnixNano: compared every step, cheaper than time.Time
	n    int
	last int64 // the latest add: no scan while it is out of the window
}

func (d *recentDeadlines) add(per time.Duration, now time.Time) {
	i := d.n % len(d.per)
	d.per[i], d.at[i] = per, now.UnixNano()
	d.n++
	d.last = d.at[i]
}

// tightest is the smallest time per token recorded within window of now
// and at least floor, or 0 when there is none. A request below floor
// cannot meet its deadline even alone, and no batch size helps it.
func (d *recentDeadlines) tightest(now time.Time, window, floor time.Duration) time.Duration {
	var best time.Duration
	since := now.UnixNano() - int64(window)
	if d.n == 0 || d.last < since {
		return 0
	}
	for i := range min(d.n, len(d.per)) {
		if d.at[i] < since || d.per[i] < floor {
			continue
		}
		if best == 0 || d.per[i] < best {
			best = d.per[i]
		}
	}
	return best
}

// deadlineShare is the part of a deadline request's time per token that
// a lane's step may take; the rest is left for waiting for a slot and for
// its prefill. Preemption makes that wait short, and half was more than
// it needed: at 0.75 batches grew, and in six pairs of goal-command
// invocations on stories260K at load 1.6 the p99 cut against FIFO at 20%
// adversarial prompts rose in every pair (mean 26.1% → 34.7%) for 7
// points fewer deadlines met (still 43-51 points above FIFO); at 40% it
// moved within the noise (docs/scheduling.md).
const deadlineShare = 0.75

// batchCap is the most members l admits: MaxBatch, or fewer while
// requests with deadlines keep arriving (within loadWindow) whose time per
// token a larger batch would not leave room for. Admission control keeps
// a running request's deadline, and preemption makes room for a waiting
// one; but when a full batch's step alone is too slow for the deadlines
// that arrive, each newcomer then waits for room to be made, or finds none
// when the running ones have deadlines too. On an engine whose step grows
// with every member (stories260K: 58 µs per member over 29 µs per step),
// a smaller batch costs little throughput and keeps those deadlines
// reachable; on one whose step is mostly fixed cost (a large model's
// weights read once per step) the cap stays at MaxBatch.
func (s *Scheduler) batchCap(l *lane, now time.Time) int {
	if !s.feat.admission {
		return s.cfg.MaxBatch
	}
	// A secondary lane leaves deadlines to the primary.
	if s.leavesDeadlinesToPrimary(l) {
		return s.cfg.MaxBatch
	}
	// A lane much slower than the fastest leaves deadlines to it (it takes
	// only what it finishes sooner, offloadCheck): a batch cut short for
	// them there only lengthens every wait. With a lane three times slower
	// beside the fast one, dropping that cut took the p99 cut against FIFO
	// at 20% adversarial prompts from 8-16% to 19-21% (docs/scheduling.md).
	if _, slow := s.muchSlower(l); s.feat.routing && slow {
		return s.cfg.MaxBatch
	}
	floor := time.Duration(float64(l.cost.perToken(1)) / deadlineShare)
	per := s.deadlines.tightest(now, s.loadWindow(), floor)
	if per == 0 {
		return s.cfg.MaxBatch
	}
	return l.cost.members(time.Duration(deadlineShare*float64(per)), s.cfg.MaxBatch)
}

// leavesDeadlinesToPrimary reports whether l is a secondary lane under
// routing, which keeps its full batch (batchCap) and does not preempt
// for a deadline that joined it (preempt): routing gives it the long
// answers, and the primary takes every queue's requests, so small
// batches for deadlines are the primary's (the secondary takes what is
// at stake only into a free slot). Cutting the secondary's batch too
// slowed the long answers that set the tail, for planners the primary
// would serve: on stories260K, with the lanes yielding, leaving deadlines
// to the primary cut the p99 at 20% adversarial prompts by 28.4-33.9%
// against 24.5-29.3% in six pairs, and met about as many deadlines
// (docs/scheduling.md, "Deadlines on the primary").
func (s *Scheduler) leavesDeadlinesToPrimary(l *lane) bool {
	return s.feat.routing && l.idx > 0
}
