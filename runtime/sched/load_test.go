package sched

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestOfferedLoadFollowsTheArrivalRate(t *testing.T) {
	var o offeredLoad
	start := time.Unix(1_000_000, 0)
	const window = time.Second
	// 40 tokens every 100 ms for 20 windows: 400 tokens/s.
	now := start
	for range 200 {
		now = now.Add(100 * time.Millisecond)
		o.add(40, now, window)
	}
	// Sampled just after an arrival the sum holds that arrival in full:
	// the steady state is 40/(1-e^-0.1) over the window, 5% above 400.
	if r := o.rate(now, window); math.Abs(r-400) > 0.06*400 {
		t.Errorf("rate %.1f tokens/s after steady arrivals, want about 400", r)
	}
	if r := o.rate(now.Add(5*window), window); r > 0.01*400 {
		t.Errorf("rate %.1f tokens/s five windows after the last arrival, want near 0", r)
	}
	var empty offeredLoad
	if r := empty.rate(now, 0); r != 0 {
		t.Errorf("rate %.1f with no window, want 0", r)
	}
}

// loadLane is a one-lane scheduler whose full batch of 2 decodes 100
// tokens/s (10 ms per member), so shedHorizon's backlog is 256 tokens.
func loadLane(t *testing.T) (*Scheduler, *fakeClock) {
	e := newFakeEngine(nil)
	e.stepA, e.stepB, e.stepC = 0, 10*time.Millisecond, 0
	s, clock := newManual(t, Config{MaxBatch: 2, MaxQueue: 1000}, nil, e)
	s.SeedCost(0, 0, 10*time.Millisecond, 0)
	return s, clock
}

// sheddable is a request predicted at 10 tokens with 8 of them optional.
func sheddable(t *testing.T, s *Scheduler) {
	t.Helper()
	submit(t, s, Request{Prompt: prompt(10), MinTokens: 2, MaxTokens: 10, Utility: Utility{Value: 0.5}})
}

func TestShedsEarlyWhenWorkArrivesFasterThanTheLanesDecode(t *testing.T) {
	s, clock := loadLane(t)
	// Arrivals at 200 tokens/s against a capacity of 100: the queue grows
	// by 100 tokens/s. Shedding must begin once the offered load reads
	// above 1, before the backlog reaches shedHorizon.
	next := clock.Now()
	for i := 0; ; i++ {
		for !clock.Now().Before(next) {
			sheddable(t, s)
			next = next.Add(50 * time.Millisecond)
		}
		// Shedding happens in Begin: the backlog it saw is the one
		// before it (shedding shrinks it).
		s.mu.Lock()
		drain, full := s.drain(0), s.lanes[0].cost.step(2, 0)
		s.mu.Unlock()
		st := s.Begin(0)
		stats := s.Stats()
		if stats.ShedRequests > 0 {
			if drain >= shedHorizon*full {
				t.Errorf("shedding began at a backlog of %v, past shedHorizon (%v)", drain, shedHorizon*full)
			}
			if drain <= overloadHorizon*full {
				t.Errorf("shedding began at a backlog of %v, within overloadHorizon (%v)", drain, overloadHorizon*full)
			}
			if stats.OfferedLoad <= 1 {
				t.Errorf("offered load %.2f when shedding began, want > 1", stats.OfferedLoad)
			}
			return
		}
		st.Run(context.Background())
		s.End(st)
		if i > 2000 {
			t.Fatalf("no shedding after %d steps at twice the capacity (offered load %.2f)", i, stats.OfferedLoad)
		}
	}
}

func TestBurstBelowTheHorizonIsNotShed(t *testing.T) {
	s, _ := loadLane(t)
	// The same backlog as above at once, then nothing: 25 requests are
	// 250 tokens, 125 full-batch steps, an offered load below 1.
	for range 25 {
		sheddable(t, s)
	}
	if l := s.Stats().OfferedLoad; l >= 1 || l < 0.5 {
		t.Errorf("offered load %.2f after the burst, want 250/256", l)
	}
	drive(t, s, 1000)
	if st := s.Stats(); st.ShedRequests != 0 || st.Completed != 25 {
		t.Errorf("a burst below shedHorizon: %d requests shed, %d completed; want 0 and 25", st.ShedRequests, st.Completed)
	}
}

func TestBatchShrinksForDeadlinesAFullBatchCannotKeep(t *testing.T) {
	// A step costs 1 ms per member: a full batch of 8 gives each member a
	// token every 8 ms.
	run := func(t *testing.T, cfg Config, deadline time.Duration, wait time.Duration) int {
		t.Helper()
		e := newFakeEngine(nil)
		e.stepA, e.stepB, e.stepC = 0, time.Millisecond, 0
		cfg.MaxBatch, cfg.MaxQueue = 8, 100
		s, clock := newManual(t, cfg, nil, e)
		s.SeedCost(0, 0, time.Millisecond, 0)
		if deadline > 0 {
			// Uncalibrated, the prompt length is the estimate: 10 tokens.
			st := submit(t, s, Request{Prompt: prompt(10), MaxTokens: 10, Deadline: deadline})
			drive(t, s, 1000)
			collect(t, st)
		}
		clock.Add(wait)
		for range 12 {
			submit(t, s, Request{Prompt: prompt(2), MaxTokens: 50})
		}
		st := s.Begin(0)
		if st == nil {
			t.Fatal("nothing to run")
		}
		return len(st.tasks)
	}
	// 40 ms for 10 tokens is 4 ms a token: three quarters of it
	// (deadlineShare) fits a step of 3.
	if n := run(t, Config{}, 40*time.Millisecond, 0); n != 3 {
		t.Errorf("batch of %d after a request due in 4 ms a token, want 3", n)
	}
	if n := run(t, Config{}, 0, 0); n != 8 {
		t.Errorf("batch of %d without deadlines, want 8", n)
	}
	// The cap lasts while such requests keep arriving: loadWindow is 128
	// full-batch steps, about a second here.
	if n := run(t, Config{}, 40*time.Millisecond, 2*time.Second); n != 8 {
		t.Errorf("batch of %d two seconds after the last deadline request, want 8", n)
	}
	// A deadline no batch can keep (0.5 ms a token, below one member's
	// step) does not shrink the batch for nothing.
	if n := run(t, Config{}, 5*time.Millisecond, 0); n != 8 {
		t.Errorf("batch of %d after an unreachable deadline, want 8", n)
	}
	if n := run(t, Config{Ablate: Ablation{NoAdmission: true}}, 40*time.Millisecond, 0); n != 8 {
		t.Errorf("batch of %d without admission control, want 8", n)
	}
}

// TestMuchSlowerLaneKeepsItsFullBatch: beside a lane twice as fast, a
// lane leaves deadlines to the fast one and keeps its full batch, while
// the fast lane cuts its batch for them. With lanes alike in speed the
// secondary keeps its full batch too (deadlines are the primary's);
// without routing, which weighs the lanes and gives the secondary the
// long answers, both cut.
func TestMuchSlowerLaneKeepsItsFullBatch(t *testing.T) {
	caps := func(t *testing.T, cfg Config, slowB time.Duration) (fast, slow int) {
		t.Helper()
		e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
		e0.stepA, e0.stepB, e0.stepC = 0, time.Millisecond, 0
		e1.stepA, e1.stepB, e1.stepC = 0, slowB, 0
		cfg.MaxBatch, cfg.MaxQueue = 8, 100
		s, clock := newManual(t, cfg, nil, e0, e1)
		s.SeedCost(0, 0, time.Millisecond, 0)
		s.SeedCost(1, 0, slowB, 0)
		// 10 tokens in 80 ms: a step may take three quarters of 8 ms
		// (deadlineShare), so 6 members on the fast lane and 3 on one
		// twice as slow.
		st := submit(t, s, Request{Prompt: prompt(10), MaxTokens: 10, Deadline: 80 * time.Millisecond})
		drive(t, s, 1000)
		collect(t, st)
		return s.batchCap(s.lanes[0], clock.Now()), s.batchCap(s.lanes[1], clock.Now())
	}
	if fast, slow := caps(t, Config{}, 2*time.Millisecond); fast != 6 || slow != 8 {
		t.Errorf("batch caps %d and %d beside a lane twice as slow, want 6 and the slow lane's full 8", fast, slow)
	}
	if fast, slow := caps(t, Config{}, 1200*time.Microsecond); fast != 6 || slow != 8 {
		t.Errorf("batch caps %d and %d with lanes alike in speed, want 6 and the secondary's full 8", fast, slow)
	}
	if fast, slow := caps(t, Config{Ablate: Ablation{NoRouting: true}}, 2*time.Millisecond); fast != 6 || slow != 3 {
		t.Errorf("batch caps %d and %d without routing, want 6 and 3", fast, slow)
	}
}
