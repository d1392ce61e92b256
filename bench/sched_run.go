package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// RunLive replays reqs against a running scheduler in real time: each
// request is submitted at its arrival time (tokens from encode) and its
// result collected. The scheduler's and the engines' wall time over the
// run give the overhead.
func RunLive(ctx context.Context, s *sched.Scheduler, reqs []WorkRequest, encode func(string) ([]int32, error), stops []int32) (Run, error) {
	before := s.Stats()
	prompts := make([][]int32, len(reqs))
	for i, r := range reqs {
		ids, err := encode(r.Prompt)
		if err != nil {
			return Run{}, fmt.Errorf("bench: request %s: %w", r.ID, err)
		}
		prompts[i] = ids
	}
	results := make([]*sched.Result, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range reqs {
		if d := time.Until(start.Add(r.Arrival)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return Run{}, ctx.Err()
			}
		}
		st, err := s.Submit(ctx, sched.Request{ID: fmt.Sprintf("%s-%d", r.ID, start.UnixNano()), Prompt: prompts[i], Text: r.Prompt,
			MaxTokens: r.MaxTokens, MinTokens: r.MinTokens, Deadline: r.Deadline,
			Utility: sched.Utility{Value: r.Utility}, StopTokens: stops})
		if err != nil {
			return Run{}, fmt.Errorf("bench: submit %s: %w", r.ID, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = st.Wait(ctx)
		}()
	}
	wg.Wait()
	run := Run{Policy: s.Policy().String()}
	var first, last time.Time
	for i, res := range results {
		if errs[i] != nil {
			return Run{}, errs[i]
		}
		run.Outcomes = append(run.Outcomes, Outcome{Req: reqs[i], Result: *res, Response: res.Finish.Sub(res.Arrival)})
		if first.IsZero() || res.Arrival.Before(first) {
			first = res.Arrival
		}
		if res.Finish.After(last) {
			last = res.Finish
		}
	}
	after := s.Stats()
	run.Makespan = last.Sub(first)
	run.SchedWall = after.SchedulerWall - before.SchedulerWall
	run.Engine = after.EngineWall - before.EngineWall
	return run, nil
}
