package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// RunLive replays reqs against a running scheduler in real time: each
// request is submitted at its arrival time (tokens from encode) and its
// result collected. The scheduler's and the engines' wall time over the
// run give the overhead.
func RunLive(ctx context.Context, s *sched.Scheduler, reqs []WorkRequest, encode func(string) ([]int32, error), stops []int32) (Run, error) {
	// A scheduler that leaves requests waiting with every lane idle would
	// otherwise hang the benchmark (and the tests that run it) for good.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer watchStall(ctx, s.Stats, cancel, 250*time.Millisecond, 5*time.Second)()
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
	var atLastArrival sched.Stats // what was decoded by the last arrival
	lags := make([]time.Duration, len(reqs))
	start := time.Now()
	for i, r := range reqs {
		if d := time.Until(start.Add(r.Arrival)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return Run{}, ctx.Err()
			}
		}
		lags[i] = max(time.Since(start.Add(r.Arrival)), 0)
		st, err := s.Submit(ctx, sched.Request{ID: fmt.Sprintf("%s-%d", r.ID, start.UnixNano()), Prompt: prompts[i], Text: r.Prompt,
			MaxTokens: r.MaxTokens, MinTokens: r.MinTokens, Deadline: r.Deadline,
			Utility: sched.Utility{Value: r.Utility}, StopTokens: stops})
		if err != nil {
			return Run{}, fmt.Errorf("bench: submit %s: %w", r.ID, err)
		}
		if i == len(reqs)-1 {
			atLastArrival = s.Stats()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = st.Wait(ctx)
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); errors.Is(err, ErrStalled) {
		return Run{}, err
	}
	run := Run{Policy: s.Policy().String()}
	for i, res := range results {
		if errs[i] != nil {
			return Run{}, errs[i]
		}
		run.Outcomes = append(run.Outcomes, Outcome{Req: reqs[i], Result: *res, Response: res.Finish.Sub(res.Arrival)})
	}
	run.SubmitLagP99, run.SubmitLagMax = lagSummary(lags)
	after := s.Stats()
	for _, p := range prompts {
		run.PromptTokens += len(p)
	}
	run.ReusedTokens = int(after.ReusedTokens - before.ReusedTokens)
	run.phases(before, atLastArrival, after)
	run.SchedWall = after.SchedulerWall - before.SchedulerWall
	run.IntakeWall = after.IntakeWall - before.IntakeWall
	run.Engine = after.EngineWall - before.EngineWall
	run.Steps = laneSteps(after) - laneSteps(before)
	return run, nil
}

// lagSummary is the 99th percentile of lags, as the response times' p99
// is taken (schedPercentile), and the largest (zero for none).
func lagSummary(lags []time.Duration) (p99, worst time.Duration) {
	if len(lags) == 0 {
		return 0, 0
	}
	secs := make([]float64, len(lags))
	for i, d := range lags {
		secs[i] = d.Seconds()
	}
	slices.Sort(secs)
	sec := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	return sec(schedPercentile(secs, 0.99)), sec(secs[len(secs)-1])
}

// ErrStalled is the cause RunLive gives up with when the scheduler leaves
// requests waiting while every lane sits idle (sched.Stats.Stalled).
var ErrStalled = errors.New("bench: the scheduler stalled")

// watchStall polls stats every `every` and cancels with ErrStalled once
// they report a stall (requests waiting with every lane idle) of at least
// `after`. It returns a function that stops it.
func watchStall(ctx context.Context, stats func() sched.Stats, cancel context.CancelCauseFunc, every, after time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if st := stats(); st.Stalled >= after {
					cancel(fmt.Errorf("%w: %d requests waited %v with every lane idle", ErrStalled, st.Waiting, st.Stalled.Round(time.Millisecond)))
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// phases sets the run's makespan and the rates at which its lanes decoded
// in its two phases and the mean context of those tokens, from the
// scheduler's counts at its start, at the last arrival and at its end.
func (run *Run) phases(atStart, atLastArrival, atEnd sched.Stats) {
	first, lastArrival, last := runSpan(run.Outcomes)
	run.Makespan = last.Sub(first)
	run.Arrival = decodedBetween(atStart, atLastArrival, lastArrival.Sub(first))
	run.Drain = decodedBetween(atLastArrival, atEnd, last.Sub(lastArrival))
}

// decodedBetween is what a scheduler decoded between two snapshots of
// its stats d apart (zero when nothing was, or d is not positive).
func decodedBetween(from, to sched.Stats, d time.Duration) Decoded {
	tokens := float64(to.Tokens - from.Tokens)
	if d <= 0 || tokens == 0 {
		return Decoded{}
	}
	return Decoded{Rate: tokens / d.Seconds(), Context: float64(to.Attended-from.Attended) / tokens}
}

// At is the rate converted to a mean context of context (RateAtContext).
func (d Decoded) At(context float64, lanes []StepCosts, batch int) float64 {
	return RateAtContext(d.Rate, d.Context, context, lanes, batch)
}

// runSpan returns the first and last arrivals and the last finish among outs.
func runSpan(outs []Outcome) (first, lastArrival, last time.Time) {
	for _, o := range outs {
		res := o.Result
		if first.IsZero() || res.Arrival.Before(first) {
			first = res.Arrival
		}
		if res.Arrival.After(lastArrival) {
			lastArrival = res.Arrival
		}
		if res.Finish.After(last) {
			last = res.Finish
		}
	}
	return first, lastArrival, last
}

// BestRate is the fastest any of runs decoded over its arrivals or its
// drain, in tokens per second, each phase's rate converted to a mean
// context of context (RateAtContext on lanes at full batch): what the
// real engine's second pair of floors assumes every schedule could keep
// up throughout, on a workload whose tokens follow that much context on
// average. Unconverted, the phase that decoded the short answers set it:
// on stories260K at 40% adversarial prompts tandem's arrivals decode
// mostly short contexts, and a token at 450 of context costs three times
// one at 50, so the floors asked every schedule to decode the long
// answers at the short ones' rate.
func BestRate(runs []Run, lanes []StepCosts, batch int, context float64) float64 {
	var best float64
	for _, r := range runs {
		best = max(best, r.Arrival.At(context, lanes, batch), r.Drain.At(context, lanes, batch))
	}
	return best
}

// MeanContext is the mean context the tokens ResponseFloor counts for
// reqs follow: a request's prompt and its answer before each.
func MeanContext(reqs []WorkRequest, promptTokens func(string) int) float64 {
	if promptTokens == nil {
		promptTokens = simPromptTokens
	}
	var tokens, sum float64
	for _, r := range reqs {
		n := float64(floorTokens(r))
		p := float64(promptTokens(r.Prompt))
		tokens += n
		sum += n*p + n*(n-1)/2
	}
	if tokens == 0 {
		return 0
	}
	return sum / tokens
}

// LiveTokenTime measures a running scheduler's time per token for one
// request alone (the fastest of three runs of 64 tokens from prompt: a
// one-off stall is not the engine). The real-engine runs set their
// deadlines from it.
func LiveTokenTime(ctx context.Context, s *sched.Scheduler, prompt []int32) (time.Duration, error) {
	const n = 64
	var best time.Duration
	for range 3 {
		start := time.Now()
		st, err := s.Submit(ctx, sched.Request{Prompt: prompt, MaxTokens: n})
		if err != nil {
			return 0, err
		}
		res, err := st.Wait(ctx)
		if err != nil {
			return 0, err
		}
		if per := time.Since(start) / time.Duration(max(res.TotalGenerated, 1)); best == 0 || per < best {
			best = per
		}
	}
	return best, nil
}

// LiveMeanTokens runs reqs as one burst to completion and returns the
// tokens a request generated on average, counted as the capacity probes
// count them. The real-engine runs take their arrival rates from it: the
// model, not the workload, decides where an answer ends (stories260K's
// ended the adversarial ones near 300 tokens where the workload asks up
// to 448), so a rate from the workload's lengths offered loads of 1.78,
// 1.44 and 1.35 at 0, 20 and 40% adversarial for a nominal 1.6.
func LiveMeanTokens(ctx context.Context, s *sched.Scheduler, reqs []sched.Request) (float64, error) {
	if len(reqs) == 0 {
		return 0, fmt.Errorf("bench: no requests to measure")
	}
	before := s.Stats().Tokens
	streams := make([]*sched.Stream, 0, len(reqs))
	for _, r := range reqs {
		st, err := s.Submit(ctx, r)
		if err != nil {
			return 0, err
		}
		streams = append(streams, st)
	}
	for _, st := range streams {
		if _, err := st.Wait(ctx); err != nil {
			return 0, err
		}
	}
	return float64(s.Stats().Tokens-before) / float64(len(reqs)), nil
}

// FastestCapacity is the most the lanes decode at any batch cap up to
// maxBatch, and the cap that gave it: full (measured at maxBatch) against
// one probe at each smaller power of two. The full batch is not always
// the fastest: on the 5.5 MiB model eight long contexts spill their KV
// out of L3, and tandem's runs at 3 members a step decoded more than the
// full-batch probe, so floors from that probe were above tandem's p99.
func FastestCapacity(full float64, maxBatch int, probe func(maxBatch int) (float64, error)) (best float64, batch int, err error) {
	best, batch = full, maxBatch
	for mb := 1; mb < maxBatch; mb *= 2 {
		got, err := probe(mb)
		if err != nil {
			return 0, 0, err
		}
		if got > best {
			best, batch = got, mb
		}
	}
	return best, batch, nil
}

// LiveCapacity is the highest of runs LiveThroughput measurements of the
// same burst. A slow spell of a shared machine lowers one burst's figure,
// and the offered loads taken from it then overload the engine less than
// they say: one invocation on a 2-vCPU VM measured 17004 tok/s at 40%
// adversarial prompts, and FIFO's runs at "load 1.6" then decoded 20561.
func LiveCapacity(ctx context.Context, s *sched.Scheduler, burst []sched.Request, runs int) (Decoded, error) {
	var best Decoded
	for range max(runs, 1) {
		c, err := LiveThroughput(ctx, s, burst)
		if err != nil {
			return Decoded{}, err
		}
		if c.Rate > best.Rate {
			best = c
		}
	}
	return best, nil
}

// Decoded is a measured decode rate, in tokens per second, and the mean
// context its tokens followed (sched.Stats.Attended): the same lanes
// decode long answers slower (RateAtContext).
type Decoded struct{ Rate, Context float64 }

// CapacityDrift is how far a second capacity probe, taken after runs,
// may read above the first before AtCapacity runs them again.
const CapacityDrift = 0.10

// Capacity is what AtCapacity measured: the first probe, the capacity
// the runs it kept took their loads from, the probe after them, and
// whether the first runs were thrown away.
type Capacity struct {
	First, Used, After Decoded
	Rerun              bool
}

// AtCapacity calls runs with a capacity from probe, then probes again.
// A slow spell of a shared machine during the first probe, even its
// fastest burst, lowers the figure; the runs then offer less load than
// they say (a 2-vCPU VM probed 15841 tok/s and FIFO's runs at "load 1.6"
// then decoded 21695, so the row was about at capacity, not overloaded).
// When the second probe reads more than CapacityDrift above the first,
// runs is called once more with it, and the caller keeps that call's
// results. A second probe that reads lower keeps the runs: the first
// probe's fastest burst is the better figure, and overload stays
// overload.
func AtCapacity(probe func() (Decoded, error), runs func(capacity float64) error) (Capacity, error) {
	var res Capacity
	var err error
	if res.First, err = probe(); err != nil {
		return res, err
	}
	res.Used = res.First
	if err := runs(res.Used.Rate); err != nil {
		return res, err
	}
	if res.After, err = probe(); err != nil || res.After.Rate <= res.Used.Rate*(1+CapacityDrift) {
		return res, err
	}
	res.Rerun, res.Used = true, res.After
	if err := runs(res.Used.Rate); err != nil {
		return res, err
	}
	res.After, err = probe()
	return res, err
}

// LiveThroughput measures what a running scheduler decodes, in tokens per
// second, while a burst of requests keeps every lane's batch full: from
// the burst's submission until its queue runs dry (then lanes drain at
// smaller batches, which is not their capacity). The real-engine runs
// take their offered loads from it, with a burst drawn from the workload
// itself: its prompts and answer lengths, and so its context lengths,
// set what a step costs. Once the queue has run dry, the requests still
// running are cancelled, not waited for: on a slow lane (a CPU beside a
// GPU, decoding a 1B model at a few tokens a second) their tails took
// minutes per burst and measured nothing. It returns when every stream
// of the burst has ended, so the lanes are free for what comes next.
func LiveThroughput(ctx context.Context, s *sched.Scheduler, burst []sched.Request) (Decoded, error) {
	before := s.Stats()
	start := time.Now()
	burstCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var streams []*sched.Stream
	for _, r := range burst {
		st, err := s.Submit(burstCtx, r)
		if err != nil {
			return Decoded{}, err
		}
		streams = append(streams, st)
	}
	done := make(chan error, 1)
	go func() {
		for _, st := range streams {
			if _, err := st.Wait(ctx); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var full time.Duration
	var atFull sched.Stats
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return Decoded{}, err
			}
			if full <= 0 { // drained before the first look: the whole burst
				full, atFull = time.Since(start), s.Stats()
			}
			return decodedBetween(before, atFull, full), nil
		case <-tick.C:
			st := s.Stats()
			switch {
			case st.Waiting > 0:
				full, atFull = time.Since(start), st
			case full > 0:
				cancel() // dry: the rest is the tail
			}
		}
	}
}
