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
