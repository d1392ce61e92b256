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

// LiveCapacity measures a running scheduler as the benchmark sees it
// (goroutines, wakeups and all): the time per token of one request alone,
// and the tokens per second of a saturating burst (every lane's batch
// full). The real-engine runs set their deadlines and offered loads from
// these, since per-step costs measured in isolation miss the live
// system's overheads.
func LiveCapacity(ctx context.Context, s *sched.Scheduler, prompt []int32, lanes, batch int) (tokenTime time.Duration, tokPerS float64, err error) {
	const n = 64
	run := func(count int) (time.Duration, int, error) {
		var streams []*sched.Stream
		start := time.Now()
		for range count {
			st, err := s.Submit(ctx, sched.Request{Prompt: prompt, MaxTokens: n})
			if err != nil {
				return 0, 0, err
			}
			streams = append(streams, st)
		}
		tokens := 0
		for _, st := range streams {
			res, err := st.Wait(ctx)
			if err != nil {
				return 0, 0, err
			}
			tokens += res.TotalGenerated
		}
		return time.Since(start), tokens, nil
	}
	var best time.Duration
	for range 3 { // the fastest of three: a one-off stall is not the engine
		d, k, err := run(1)
		if err != nil {
			return 0, 0, err
		}
		if per := d / time.Duration(max(k, 1)); best == 0 || per < best {
			best = per
		}
	}
	d, k, err := run(4 * lanes * batch)
	if err != nil {
		return 0, 0, err
	}
	return best, float64(k) / d.Seconds(), nil
}
