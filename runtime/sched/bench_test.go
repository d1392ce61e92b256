package sched

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkStep measures the scheduler's own cost per step (plan,
// delivery and the submissions that keep the queue at the given depth;
// the engine is a no-op): the overhead a lane pays per engine step.
func BenchmarkStep(b *testing.B) {
	for _, depth := range []int{8, 64, 256} {
		for _, p := range []Policy{Tandem, FIFO} {
			b.Run(fmt.Sprintf("%v/queue=%d", p, depth), func(b *testing.B) { benchmarkStep(b, p, depth, nil) })
		}
	}
}

// BenchmarkStepCold is BenchmarkStep with the caches a real engine step
// leaves: each step walks a buffer larger than the L2 cache, as a forward
// pass streams weights and activations, so the scheduler finds its data
// evicted. Misses, not instructions, make most of its cost in a real run.
func BenchmarkStepCold(b *testing.B) {
	evict := make([]byte, 8<<20)
	for _, p := range []Policy{Tandem, FIFO} {
		b.Run(fmt.Sprintf("%v/queue=24", p), func(b *testing.B) {
			benchmarkStep(b, p, 24, func() {
				for i := 0; i < len(evict); i += 64 {
					evict[i]++
				}
			})
		})
	}
}

// benchmarkStep runs two lanes' steps on no-op engines with the queue
// kept at depth; afterRun, if set, runs between each step's Run and End.
func benchmarkStep(b *testing.B, p Policy, depth int, afterRun func()) {
	e := newFakeEngine(nil)
	e.stepA, e.stepB, e.stepC = 0, 0, 0
	clock := newClock()
	e.clock = clock
	s, err := New(Config{Policy: p, Manual: true, Now: clock.Now, MaxQueue: depth + 64}, nil, Lane{Engine: e}, Lane{Engine: newFakeEngine(clock)})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	top := func() {
		for s.waitingCount() < depth || n < 16 {
			n++
			var dl time.Duration
			if n%3 == 0 {
				dl = time.Duration(n%50+1) * time.Millisecond
			}
			if _, err := s.Submit(context.Background(), Request{Prompt: prompt(4 + n%40), MaxTokens: 8 + n%50, MinTokens: n % 4, Deadline: dl}); err != nil {
				b.Fatal(err)
			}
		}
	}
	top()
	b.ResetTimer()
	for range b.N {
		for i := range 2 {
			st := s.Begin(i)
			if st == nil {
				continue
			}
			st.Run(context.Background())
			if afterRun != nil {
				afterRun()
			}
			s.End(st)
		}
		clock.Add(time.Millisecond)
		top()
	}
	// The scheduler's own wall time per step, submissions
	// included (the loop's time also counts the test's code).
	st := s.Stats()
	steps := st.Lanes[0].Steps + st.Lanes[1].Steps
	b.ReportMetric(float64(st.SchedulerWall.Nanoseconds())/float64(max(steps, 1)), "sched-ns/step")
}

// BenchmarkExtract measures the per-request feature extraction Submit
// pays (and counts as scheduler overhead).
func BenchmarkExtract(b *testing.B) {
	text := "Summarize everything about the harbor and the lantern, and then describe what happened to them in detail. What could it mean, and why?"
	for range b.N {
		Extract(text, 30)
	}
}
