package bench

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/weights"
)

func TestWorkloadShape(t *testing.T) {
	cfg := WorkloadConfig{Requests: 4000, Rate: 10, Adversarial: 0.2, Variance: VarianceNormal, TokenTime: time.Millisecond, MaxTokens: 400, Seed: 3}
	reqs := Workload(cfg)
	if len(reqs) != cfg.Requests {
		t.Fatalf("%d requests", len(reqs))
	}
	count := map[Class]int{}
	var last time.Duration
	for _, r := range reqs {
		count[r.Class]++
		if r.Arrival < last {
			t.Fatalf("arrivals out of order at %s", r.ID)
		}
		last = r.Arrival
		if r.MaxTokens < 2 || r.MaxTokens > 400 || r.Natural < 1 || r.Natural > r.MaxTokens || r.Prompt == "" {
			t.Fatalf("bad request %+v", r)
		}
		if (r.Class == Planner) != (r.Deadline > 0 && r.Utility == 2) && r.Class != Chat {
			t.Fatalf("deadline/utility of %v: %+v", r.Class, r)
		}
		if r.Class == Summary && (r.MinTokens < 1 || r.MinTokens > r.MaxTokens) {
			t.Fatalf("summary without a mandatory part: %+v", r)
		}
	}
	if share := float64(count[Adversarial]) / float64(len(reqs)); math.Abs(share-0.2) > 0.03 {
		t.Errorf("adversarial share %.3f, want 0.2", share)
	}
	// Poisson arrivals at 10/s: the mean gap is 100 ms.
	if gap := last.Seconds() / float64(len(reqs)); math.Abs(gap-0.1) > 0.01 {
		t.Errorf("mean gap %.3fs, want 0.1s", gap)
	}
	// The same seed gives the same workload.
	again := Workload(cfg)
	for i := range reqs {
		if reqs[i] != again[i] {
			t.Fatalf("request %d differs between runs with one seed", i)
		}
	}
}

// simLane is the lane simRun's lanes are made of.
var simLane = StepCosts{Name: "test", A: 100 * time.Millisecond, B: 20 * time.Millisecond, C: time.Millisecond, MaxSeqs: 16, Context: 2048}

func simRun(t *testing.T, p sched.Policy, load float64) Run {
	t.Helper()
	return simRunLanes(t, p, load, []StepCosts{simLane, simLane})
}

// simRunLanes simulates p on lanes at load (1.0: the lanes' capacity at
// full batch together).
func simRunLanes(t *testing.T, p sched.Policy, load float64, lanes []StepCosts) Run {
	t.Helper()
	mean := 60.0 // about the workload's mean output at 20% adversarial
	var capacity float64
	for _, l := range lanes {
		capacity += l.Capacity(8)
	}
	rate := load * capacity / mean
	reqs := Workload(WorkloadConfig{Requests: 200, Rate: rate, Adversarial: 0.1, Variance: VarianceNormal, TokenTime: lanes[0].TokenTime(), MaxTokens: 1900, Seed: 5})
	run, err := Simulate(reqs, SimConfig{Sched: sched.Config{Policy: p, MaxQueue: 500}, Lanes: lanes})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Outcomes) != len(reqs) {
		t.Fatalf("%v: %d of %d requests finished", p, len(run.Outcomes), len(reqs))
	}
	return run
}

// TestTandemKeepsLongRequestsOffASlowLane: beside a lane about 30 times
// slower at full batch (a CPU lane beside a GPU lane), tandem gives the
// slow lane only requests it finishes before the fast lane could, none of
// the longest tenth, and in overload its p99 response time is below
// FIFO's, which runs whatever comes next on whichever lane has room.
func TestTandemKeepsLongRequestsOffASlowLane(t *testing.T) {
	slow := simLane
	slow.A, slow.B = 3*simLane.A, 45*simLane.B
	lanes := []StepCosts{simLane, slow}
	fifo, tandem := Summarize(simRunLanes(t, sched.FIFO, 1.5, lanes)), simRunLanes(t, sched.Tandem, 1.5, lanes)
	var scores []float64
	for _, o := range tandem.Outcomes {
		scores = append(scores, o.Result.Score)
	}
	slices.Sort(scores)
	long := scores[len(scores)*9/10]
	onSlow := 0
	for _, o := range tandem.Outcomes {
		if o.Result.Lane == 1 {
			onSlow++
			if o.Result.Score >= long {
				t.Errorf("request %s (score %.0f, the longest tenth from %.0f) ran on the slow lane", o.Req.ID, o.Result.Score, long)
			}
		}
	}
	if onSlow == 0 {
		t.Errorf("the slow lane served nothing: it should take short requests while the fast lane is backed up")
	}
	if row := Summarize(tandem); row.P99 >= fifo.P99 {
		t.Errorf("p99 %v with a slow lane, FIFO %v: want below FIFO's", row.P99, fifo.P99)
	}
}

func TestSimulatorRunsTheRealScheduler(t *testing.T) {
	for _, p := range sched.Policies() {
		run := simRun(t, p, 0.3)
		row := Summarize(run)
		for _, o := range run.Outcomes {
			r := o.Result
			if r.Reason != sched.ReasonStop && r.Reason != sched.ReasonLength && r.Reason != sched.ReasonShed {
				t.Fatalf("%v: request %s ended %v", p, o.Req.ID, r.Reason)
			}
			want := min(o.Req.Natural, o.Req.MaxTokens)
			if r.Reason != sched.ReasonShed && r.TotalGenerated != want {
				t.Fatalf("%v: request %s generated %d tokens, the simulator gives %d", p, o.Req.ID, r.TotalGenerated, want)
			}
		}
		// At light load every policy keeps nearly every deadline, and
		// the simulated engine time is the work done. The lanes' part of
		// the scheduler's time is some of it, not all: the intake scored
		// every request.
		if row.Attainment < 90 || run.Engine <= 0 || row.Overhead <= 0 || row.Overhead > 5 {
			t.Errorf("%v at light load: %+v", p, row)
		}
		if run.IntakeWall <= 0 || run.IntakeWall >= run.SchedWall || row.LaneOverhead <= 0 || row.LaneOverhead >= row.Overhead {
			t.Errorf("%v: intake's scheduler time %v of %v (lanes' overhead %.4f of %.4f%%)", p, run.IntakeWall, run.SchedWall, row.LaneOverhead, row.Overhead)
		}
		// Every token came from a step of at most a full batch (8, the
		// default cap); prefill-only steps pull the mean below it.
		if run.Steps == 0 || row.TokensPerStep < 1 || row.TokensPerStep > 8 {
			t.Errorf("%v: %d steps, %.2f tokens per step", p, run.Steps, row.TokensPerStep)
		}
		if row.SchedPerRequest != run.SchedWall/time.Duration(len(run.Outcomes)) {
			t.Errorf("%v: %v scheduler time per request, %v over %d requests", p, row.SchedPerRequest, run.SchedWall, len(run.Outcomes))
		}
	}
}

// TestSimulatorServesEveryRequest: on lanes alike, apart by 1.6 to 29
// times, or with the primary the slower, at light load and in overload,
// with and without adversarial prompts, every request is answered:
// Simulate fails when its lanes all go idle with a request still waiting
// (as one did when a much slower lane refused the request whose cache
// it held).
func TestSimulatorServesEveryRequest(t *testing.T) {
	pairs := map[string][]StepCosts{"alike": {simLane, simLane}}
	for _, f := range []float64{1.6, 3, 10, 29} {
		slow := simLane
		slow.A, slow.B, slow.C = time.Duration(f*float64(slow.A)), time.Duration(f*float64(slow.B)), time.Duration(f*float64(slow.C))
		pairs[fmt.Sprintf("%gx", f)] = []StepCosts{simLane, slow}
		if f == 3 {
			pairs["primary 3x slower"] = []StepCosts{slow, simLane}
		}
	}
	seeds := 3
	if testing.Short() {
		seeds = 1
	}
	for name, lanes := range pairs {
		for _, p := range []sched.Policy{sched.Tandem, sched.FIFO} {
			for _, load := range []float64{0.6, 1.6} {
				for _, adv := range []float64{0, 0.4} {
					for seed := range seeds {
						var capacity float64
						for _, l := range lanes {
							capacity += l.Capacity(8)
						}
						reqs := Workload(WorkloadConfig{Requests: 150, Rate: load * capacity / 80, Adversarial: adv, Variance: VarianceNormal,
							TokenTime: lanes[0].TokenTime(), MaxTokens: 1900, Seed: uint64(seed + 11)})
						if _, err := Simulate(reqs, SimConfig{Sched: sched.Config{Policy: p, MaxQueue: 500}, Lanes: lanes}); err != nil {
							t.Errorf("%s lanes, %v, load %.1f, %.0f%% adversarial, seed %d: %v", name, p, load, 100*adv, seed+11, err)
						}
					}
				}
			}
		}
	}
}

// TestWatchStallGivesUpOnIdleLanes: a stall the scheduler reports
// (requests waiting with every lane idle, sched.Stats.Stalled) cancels the
// run with ErrStalled once it has lasted the given time; a shorter one,
// or none, does not.
func TestWatchStallGivesUpOnIdleLanes(t *testing.T) {
	var mu sync.Mutex
	st := sched.Stats{Waiting: 2}
	stats := func() sched.Stats {
		mu.Lock()
		defer mu.Unlock()
		return st
	}
	set := func(d time.Duration) {
		mu.Lock()
		st.Stalled = d
		mu.Unlock()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := watchStall(ctx, stats, cancel, time.Millisecond, 30*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	set(29 * time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if err := context.Cause(ctx); err != nil {
		t.Fatalf("cancelled with no stall, then one shorter than the limit: %v", err)
	}
	set(30 * time.Millisecond)
	select {
	case <-ctx.Done():
		if err := context.Cause(ctx); !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "2 requests waited 30ms") {
			t.Errorf("cause %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("not cancelled once the stall reached the limit")
	}
	stop()
	// Stopped, it cancels nothing more.
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	defer cancel2(nil)
	watchStall(ctx2, stats, cancel2, time.Millisecond, 10*time.Millisecond)()
	time.Sleep(50 * time.Millisecond)
	if ctx2.Err() != nil {
		t.Error("a stopped watch cancelled")
	}
}

// TestRunPhasesSplitTheTokens: a run's two rates, over its arrivals and
// over its drain, account for every token it decoded, and under overload
// the drain runs near the lanes' full-batch capacity and no faster.
func TestRunPhasesSplitTheTokens(t *testing.T) {
	run := simRun(t, sched.FIFO, 1.5)
	first, lastArrival, last := runSpan(run.Outcomes)
	tokens := 0
	for _, o := range run.Outcomes {
		tokens += o.Result.TotalGenerated
	}
	split := run.Arrival.Rate*lastArrival.Sub(first).Seconds() + run.Drain.Rate*last.Sub(lastArrival).Seconds()
	if math.Abs(split-float64(tokens)) > 0.5 || run.Arrival.Rate <= 0 || run.Drain.Rate <= 0 {
		t.Errorf("rates %.0f over the arrivals and %.0f over the drain account for %.1f tokens; the run decoded %d", run.Arrival.Rate, run.Drain.Rate, split, tokens)
	}
	if capacity := 2 * simLane.Capacity(8); run.Drain.Rate > capacity || run.Drain.Rate < 0.6*capacity {
		t.Errorf("drain at %.0f tokens/s; the lanes' full-batch capacity is %.0f", run.Drain.Rate, capacity)
	}
	if m := run.Makespan; m != last.Sub(first) {
		t.Errorf("makespan %v, want %v", m, last.Sub(first))
	}
	// The phases' contexts are the mean of what their tokens followed.
	var attended, n float64
	for _, o := range run.Outcomes {
		for j := range o.Result.TotalGenerated {
			attended += float64(o.Result.PromptTokens + j)
			n++
		}
	}
	both := (run.Arrival.Context*run.Arrival.Rate*lastArrival.Sub(first).Seconds() + run.Drain.Context*run.Drain.Rate*last.Sub(lastArrival).Seconds()) / n
	if math.Abs(both-attended/n) > 0.01 || run.Arrival.Context <= 0 || run.Drain.Context <= 0 {
		t.Errorf("phases at mean contexts %.1f and %.1f make %.2f over the run; its tokens followed %.2f", run.Arrival.Context, run.Drain.Context, both, attended/n)
	}
	flat := StepCosts{A: 8 * time.Millisecond, B: time.Millisecond}
	runs := []Run{{Arrival: Decoded{Rate: 10}, Drain: Decoded{Rate: 30}}, {Arrival: Decoded{Rate: 40}, Drain: Decoded{Rate: 20}}, {}}
	if got := BestRate(runs, []StepCosts{flat}, 8, 100); got != 40 {
		t.Errorf("best rate %v, want 40", got)
	}
	if got := BestRate(nil, []StepCosts{flat}, 8, 100); got != 0 {
		t.Errorf("best rate of no runs %v", got)
	}
	// With context priced (2 ms a token at 100, 4 at 300), a fast phase
	// of short answers counts at its rate at the workload's context.
	ctxLane := StepCosts{A: 8 * time.Millisecond, B: time.Millisecond, D: 10 * time.Microsecond, BAt: 100}
	runs = []Run{{Arrival: Decoded{Rate: 40, Context: 100}, Drain: Decoded{Rate: 30, Context: 300}}}
	if got := BestRate(runs, []StepCosts{ctxLane}, 8, 300); math.Abs(got-30) > 1e-9 {
		t.Errorf("best rate at 300 of context %v, want 30 (the drain's; the arrivals' 40 at 100 is 20 there)", got)
	}
}

// TestRunLiveRecordsSubmitLag: requests that all arrive at once are
// submitted one after another, so every one after the first reaches
// Submit after its arrival time, and the run says so.
func TestRunLiveRecordsSubmitLag(t *testing.T) {
	cost := StepCosts{A: 2 * time.Millisecond, B: 250 * time.Microsecond, MaxSeqs: 32, Context: 512}
	lanes := []sched.Lane{{Engine: sleepEngine{newSimEngine(cost, nil)}}}
	s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxBatch: 8}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	var reqs []WorkRequest
	for i := range 20 {
		reqs = append(reqs, WorkRequest{ID: fmt.Sprint(i), Prompt: "a", MaxTokens: 4})
	}
	encode := func(string) ([]int32, error) { return []int32{1}, nil }
	run, err := RunLive(context.Background(), s, reqs, encode, nil)
	if err != nil {
		t.Fatal(err)
	}
	if run.SubmitLagP99 <= 0 || run.SubmitLagMax < run.SubmitLagP99 {
		t.Errorf("submit lag p99 %v, worst %v: twenty requests arriving at once were not all submitted at their arrival", run.SubmitLagP99, run.SubmitLagMax)
	}
}

// TestLagSummary: the clients' lateness is summarised by its 99th
// percentile (interpolated, as the response times' p99) and its worst,
// by hand.
func TestLagSummary(t *testing.T) {
	var lags []time.Duration
	for i := 200; i >= 1; i-- { // out of order: the summary sorts
		lags = append(lags, time.Duration(i)*time.Millisecond)
	}
	// Position 0.99 × 199 = 197.01 in the sorted lags: 198 ms + 0.01 ms.
	if p99, worst := lagSummary(lags); (p99-198010*time.Microsecond).Abs() > time.Microsecond || worst != 200*time.Millisecond {
		t.Errorf("lags 1-200 ms: p99 %v, worst %v; want 198.01ms and 200ms", p99, worst)
	}
	if p99, worst := lagSummary([]time.Duration{5 * time.Millisecond}); p99 != 5*time.Millisecond || worst != 5*time.Millisecond {
		t.Errorf("one lag of 5 ms: p99 %v, worst %v", p99, worst)
	}
	if p99, worst := lagSummary(nil); p99 != 0 || worst != 0 {
		t.Errorf("no lags: p99 %v, worst %v", p99, worst)
	}
}

// TestMeanContext: a request's tokens follow its prompt and the answer
// before them; MinTokens cuts the answer as the floor does.
func TestMeanContext(t *testing.T) {
	reqs := []WorkRequest{{Prompt: "a", Natural: 3, MaxTokens: 10}, {Prompt: "b", Natural: 50, MaxTokens: 10, MinTokens: 1}}
	lens := map[string]int{"a": 4, "b": 7}
	// a: 4, 5, 6; b: 7.
	if got := MeanContext(reqs, func(p string) int { return lens[p] }); math.Abs(got-22.0/4) > 1e-9 {
		t.Errorf("mean context %v, want %v", got, 22.0/4)
	}
}

func TestSimulatorTandemBeatsFIFOUnderOverload(t *testing.T) {
	fifo, tandem := Summarize(simRun(t, sched.FIFO, 1.5)), Summarize(simRun(t, sched.Tandem, 1.5))
	if tandem.Attainment < fifo.Attainment+20 {
		t.Errorf("deadlines met: tandem %.1f%%, FIFO %.1f%%", tandem.Attainment, fifo.Attainment)
	}
	if tandem.Mean >= fifo.Mean {
		t.Errorf("mean response: tandem %v, FIFO %v", tandem.Mean, fifo.Mean)
	}
	if tandem.ShedTokens == 0 {
		t.Error("no optional tokens shed under overload")
	}
}

func TestSummarizeAndGoals(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	mk := func(resp time.Duration, dl, met bool, util float64) Outcome {
		return Outcome{Req: WorkRequest{Utility: 1}, Response: resp,
			Result: sched.Result{HasDeadline: dl, DeadlineMet: met, Utility: util, TotalGenerated: 10}}
	}
	var outs []Outcome
	for i := 1; i <= 100; i++ {
		o := mk(time.Duration(i)*time.Second, i%2 == 0, i%4 == 0, 0.5)
		// Arrivals a second apart, the last at 100 s; the first request
		// finishes last, at 250 s (the last one at 200 s).
		o.Result.Arrival = t0.Add(time.Duration(i) * time.Second)
		o.Result.Finish = o.Result.Arrival.Add(time.Duration(i) * time.Second)
		if i == 1 {
			o.Result.Finish = t0.Add(250 * time.Second)
		}
		outs = append(outs, o)
	}
	row := Summarize(Run{Policy: "fifo", Outcomes: outs, Makespan: 100 * time.Second, SchedWall: time.Second, IntakeWall: 700 * time.Millisecond, Engine: 100 * time.Second, Steps: 400})
	if row.Mean != 50500*time.Millisecond || row.P50 != 50500*time.Millisecond || math.Abs(row.P99.Seconds()-99.01) > 1e-6 {
		t.Errorf("mean %v p50 %v p99 %v", row.Mean, row.P50, row.P99)
	}
	if row.Deadlines != 50 || row.Attainment != 50 || row.Utility != 50 || row.Overhead != 1 || math.Abs(row.LaneOverhead-0.3) > 1e-12 || row.Throughput != 1 || row.TokPerS != 10 {
		t.Errorf("row %+v", row)
	}
	// 1000 tokens in 400 steps; a second of scheduling over 100 requests.
	if row.TokensPerStep != 2.5 || row.SchedPerRequest != 10*time.Millisecond {
		t.Errorf("%.2f tokens per step, %v scheduler time per request", row.TokensPerStep, row.SchedPerRequest)
	}
	if row.Drain != 150*time.Second { // the last arrival at 100 s, the last finish at 250 s
		t.Errorf("drain %v, want 150s", row.Drain)
	}
	if row.Max != 100*time.Second {
		t.Errorf("slowest response %v, want 100s", row.Max)
	}
	rows := []SchedRow{
		{Engine: "e", Policy: "fifo", Load: 1, P99: 10 * time.Second, Attainment: 10},
		{Engine: "e", Policy: "tandem", Load: 1, P99: 6 * time.Second, P99Floor: 4 * time.Second, Drain: 5 * time.Second, Attainment: 40, Overhead: 0.5},
		{Engine: "e", Policy: "tandem", Load: 0.5, P99: time.Second, Attainment: 100, Overhead: 2},
	}
	g := Goals(rows)
	if len(g) != 1 || math.Abs(g[0].P99Reduction-40) > 1e-9 || g[0].AttainmentGain != 30 || !g[0].MetP99Goal || !g[0].MetAttainGoal || g[0].MaxOverhead != 2 {
		t.Errorf("goals %+v", g)
	}
	if !strings.Contains(GoalTable(g), "40.0% met") || !strings.Contains(SchedTable(rows), "| tandem |") ||
		!strings.Contains(SchedTable([]SchedRow{row}), "| 10 | 2.50 | 50.0% (50) | 50.0% | 0 | 1.000% | 10000.0 |") {
		t.Error("tables lack the figures")
	}
	// The overhead goal is under 1% at every load.
	if !strings.Contains(GoalTable(g), "| 2.000% missed |") {
		t.Errorf("goal table passes an overhead of 2%%:\n%s", GoalTable(g))
	}
	rows[2].Overhead = 0.9
	if !strings.Contains(GoalTable(Goals(rows)), "| 0.900% met |") {
		t.Errorf("goal table fails an overhead of 0.9%%:\n%s", GoalTable(Goals(rows)))
	}
	// The floor goes with its reduction from FIFO's p99; unknown, a dash.
	if !strings.Contains(GoalTable(g), "| 4.000 s (60.0%) | - | - | 1.20 |") {
		t.Errorf("goal table lacks the p99 floor and tandem's p99 over its drain:\n%s", GoalTable(g))
	}
	// A floor less than 30% below FIFO's p99 puts the goal out of reach.
	rows[1].P99, rows[1].P99Floor = 8*time.Second, 7500*time.Millisecond
	if g := Goals(rows); g[0].MetP99Goal || !g[0].P99OutOfReach || !strings.Contains(GoalTable(g), "20.0% missed (out of any policy's reach) | 7.500 s (25.0%)") {
		t.Errorf("goal out of reach not marked: %+v\n%s", g, GoalTable(g))
	}
	rows[1].P99Floor = 6500 * time.Millisecond
	if g := Goals(rows); g[0].P99OutOfReach || !strings.Contains(GoalTable(g), "20.0% missed | 6.500 s (35.0%)") {
		t.Errorf("goal within reach marked out of reach: %+v\n%s", g, GoalTable(g))
	}
	// A slowest-response floor less than 30% below FIFO's p99 leaves the
	// goal only to a policy that holds its slowest 1% back; one 30% or
	// more below does not qualify the verdict.
	rows[1].MaxFloor = 7200 * time.Millisecond
	if g := Goals(rows); g[0].P99OutOfReach || !g[0].P99NeedsHoldBack || !strings.Contains(GoalTable(g), "20.0% missed (only by holding back the slowest 1%) | 6.500 s (35.0%) | 7.200 s (28.0%) |") {
		t.Errorf("goal that needs holding back not marked: %+v\n%s", g, GoalTable(g))
	}
	rows[1].MaxFloor = 6900 * time.Millisecond
	if g := Goals(rows); g[0].P99NeedsHoldBack || !strings.Contains(GoalTable(g), "20.0% missed | 6.500 s (35.0%) | 6.900 s (31.0%) |") {
		t.Errorf("goal within a fair schedule's reach marked as needing hold-back: %+v\n%s", g, GoalTable(g))
	}
	// Out of reach says all: the hold-back note is not added to it.
	rows[1].P99Floor, rows[1].MaxFloor = 7500*time.Millisecond, 8*time.Second
	if g := Goals(rows); !g[0].P99OutOfReach || g[0].P99NeedsHoldBack || !strings.Contains(GoalTable(g), "20.0% missed (out of any policy's reach) | 7.500 s (25.0%) | 8.000 s (20.0%) |") {
		t.Errorf("out of reach and hold-back both marked: %+v\n%s", g, GoalTable(g))
	}
	// The floors at the runs' best rate, in their own column, qualify the
	// verdict only where the probe's floors left the goal open.
	rows[1].P99Floor, rows[1].MaxFloor = 6500*time.Millisecond, 6900*time.Millisecond
	rows[1].RunP99Floor, rows[1].RunMaxFloor = 7200*time.Millisecond, 7600*time.Millisecond
	if g := Goals(rows); !g[0].P99OutOfReachAtRunRate || g[0].P99NeedsHoldBackAtRunRate || math.Abs(g[0].RunFloorReduction-28) > 1e-9 ||
		!strings.Contains(GoalTable(g), "20.0% missed (out of any policy's reach at the runs' decode rate) | 6.500 s (35.0%) | 6.900 s (31.0%) | 7.200 s (28.0%) / 7.600 s (24.0%) |") {
		t.Errorf("goal out of reach at the runs' rate not marked: %+v\n%s", g, GoalTable(g))
	}
	rows[1].RunP99Floor = 6400 * time.Millisecond
	if g := Goals(rows); g[0].P99OutOfReachAtRunRate || !g[0].P99NeedsHoldBackAtRunRate ||
		!strings.Contains(GoalTable(g), "20.0% missed (at the runs' decode rate, only by holding back the slowest 1%) | 6.500 s (35.0%) | 6.900 s (31.0%) | 6.400 s (36.0%) / 7.600 s (24.0%) |") {
		t.Errorf("goal that needs holding back at the runs' rate not marked: %+v\n%s", g, GoalTable(g))
	}
	rows[1].RunMaxFloor = 6800 * time.Millisecond
	if g := Goals(rows); g[0].P99OutOfReachAtRunRate || g[0].P99NeedsHoldBackAtRunRate || !strings.Contains(GoalTable(g), "20.0% missed | 6.500 s (35.0%) | 6.900 s (31.0%) | 6.400 s (36.0%) / 6.800 s (32.0%) |") {
		t.Errorf("goal within reach at the runs' rate marked: %+v\n%s", g, GoalTable(g))
	}
	rows[1].MaxFloor, rows[1].RunMaxFloor = 7200*time.Millisecond, 7600*time.Millisecond
	if g := Goals(rows); !g[0].P99NeedsHoldBack || g[0].P99NeedsHoldBackAtRunRate || !strings.Contains(GoalTable(g), "20.0% missed (only by holding back the slowest 1%) |") {
		t.Errorf("the probe's verdict not kept first: %+v\n%s", g, GoalTable(g))
	}
	rows[1].P99, rows[1].P99Floor, rows[1].MaxFloor, rows[1].Drain = 6*time.Second, 0, 0, 0
	rows[1].RunP99Floor, rows[1].RunMaxFloor = 0, 0
	if !strings.Contains(GoalTable(Goals(rows)), "met | - | - | - | - |") {
		t.Errorf("goal table without a floor:\n%s", GoalTable(Goals(rows)))
	}
}

func TestSchedSVGIsWellFormed(t *testing.T) {
	var rows []SchedRow
	for _, p := range []string{"tandem", "fifo", "tandem -shed"} {
		for _, l := range []float64{0.5, 1, 1.5} {
			rows = append(rows, SchedRow{Engine: "sim <x>", Policy: p, Load: l, P99: time.Duration(l * float64(time.Second)), Mean: time.Second, Attainment: 100 / l, Utility: 50})
		}
	}
	svg := SchedSVG(rows)
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("not well-formed XML: %v", err)
		}
	}
	if n := strings.Count(svg, "<polyline"); n != 3*len(schedPanels) {
		t.Errorf("%d lines, want %d", n, 3*len(schedPanels))
	}
	if !strings.Contains(svg, "sim &lt;x&gt;") {
		t.Error("labels are not escaped")
	}
}

func TestMeasureStepCostsRealModel(t *testing.T) {
	// The measurement itself is covered by tandem bench sched's test on
	// the real model; here the line fit.
	a, b := schedLineFit([]float64{1, 2, 4, 8}, []float64{3, 5, 9, 17})
	if math.Abs(a-1) > 1e-9 || math.Abs(b-2) > 1e-9 {
		t.Errorf("fit %v + %v·x, want 1 + 2·x", a, b)
	}
}

// TestMeasureStepCostsPinned: a pinned lane's costs are timed on its
// CPUs; a set the process may not use is refused, not timed elsewhere.
func TestMeasureStepCostsPinned(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	// Batches of 1 and 8: a step of 8 costs several times one of 1, so
	// a busy host's noise (CI runs packages side by side) cannot hide
	// the growth, as it once hid the 30 µs between batches of 1 and 2.
	cfg := CostConfig{Threads: 1, CPUs: cpuset.Set{allowed[len(allowed)-1]}, Batches: []int{1, 8}, Reps: 3, Context: 128}
	c, err := MeasureStepCosts(f, cfg)
	if err != nil || c.A+c.B <= 0 {
		t.Fatalf("pinned: %+v, %v", c, err)
	}
	cfg.CPUs = cpuset.Set{allowed[len(allowed)-1] + 1}
	if _, err := MeasureStepCosts(f, cfg); err == nil || !strings.Contains(err.Error(), "may use only") {
		t.Errorf("CPUs outside the process: %v, want the CPUs it may use", err)
	}
}

// TestMeasureStepCostsAtAShortContext: timing long contexts on a model
// whose context is short (the embedded model's 256 tokens, here
// stories260K's cut to 128) keeps every member within it. Members that
// had their first token decoded on while the others prefilled, and the
// first ones ran out of context ("kv: context full"), so bench sched
// failed on the embedded model.
func TestMeasureStepCostsAtAShortContext(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := MeasureStepCosts(f, CostConfig{Threads: 1, Batches: []int{1, 8}, Reps: 3, Context: 128, LongContext: 448})
	if err != nil {
		t.Fatalf("costs at a 128-token context: %v", err)
	}
	if c.A+c.B <= 0 {
		t.Errorf("costs %+v: no step time", c)
	}
}

// spellEngine is a sleepEngine whose steps numbered in slow (from 0) take
// four times as long: a cold start, or a slow spell of the machine.
type spellEngine struct {
	sleepEngine
	slow map[int]bool
	n    *int
}

func (e spellEngine) Step(ctx context.Context, members []sched.Member, out []sched.StepOut) error {
	err := e.simEngine.Step(ctx, members, out)
	d := e.last
	if e.slow[*e.n] {
		d *= 4
	}
	*e.n++
	time.Sleep(d)
	return err
}

// TestTimeStepCostsTakesTheFastestSteps: a slow first prefill, a slow
// first decode step and a spell over three of batch 4's five steps leave
// the fitted costs where the engine's are. Medians would read batch 4 at
// four times its cost and the fit would be far off.
func TestTimeStepCostsTakesTheFastestSteps(t *testing.T) {
	cost := StepCosts{A: 4 * time.Millisecond, B: 2 * time.Millisecond, C: 100 * time.Microsecond, MaxSeqs: 16, Context: 2048}
	// Steps 0-7 prefill the 8 sequences; then five steps each at batch
	// 1 (8-12), 2 (13-17), 4 (18-22) and 8 (23-27).
	var n int
	e := spellEngine{sleepEngine{newSimEngine(cost, nil)}, map[int]bool{0: true, 8: true, 19: true, 20: true, 21: true}, &n}
	got, err := timeStepCosts(e, 512, CostConfig{Batches: []int{1, 2, 4, 8}, Reps: 5})
	if err != nil {
		t.Fatal(err)
	}
	if n != 28 {
		t.Fatalf("%d steps, want 28", n)
	}
	// The prefill's one sampled token is counted as a member's step, so
	// the fit's C is the engine's less B spread over the chunk.
	wantC := cost.C - cost.B/costChunk
	t.Logf("fitted %v + %v/member + %v/prefill token, engine %v + %v + %v", got.A, got.B, got.C, cost.A, cost.B, wantC)
	near := func(got, want time.Duration, tol float64) bool {
		return math.Abs(float64(got-want)) <= tol*float64(want)
	}
	if !near(got.A, cost.A, 0.25) || !near(got.B, cost.B, 0.15) || !near(got.C, wantC, 0.5) {
		t.Errorf("fitted %v + %v/member + %v/prefill token, want about %v + %v + %v", got.A, got.B, got.C, cost.A, cost.B, wantC)
	}
}

// TestTimeStepCostsMeasuresContext: on an engine whose members cost more
// the longer their context, timing full batches again at a long context
// gives D, and the fitted costs then price a token at any context about
// as the engine does. Without LongContext D stays 0.
func TestTimeStepCostsMeasuresContext(t *testing.T) {
	cost := StepCosts{A: 2 * time.Millisecond, B: time.Millisecond, C: 50 * time.Microsecond, D: 40 * time.Microsecond, MaxSeqs: 16, Context: 2048}
	engineCost := func(context float64) float64 { // per token at batch 8
		return cost.A.Seconds()/8 + cost.B.Seconds() + cost.D.Seconds()*context
	}
	cfg := CostConfig{Batches: []int{1, 2, 4, 8}, Reps: 5}
	flat, err := timeStepCosts(sleepEngine{newSimEngine(cost, nil)}, 512, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if flat.D != 0 || flat.BAt != 0 {
		t.Errorf("without LongContext: D %v at %d, want none", flat.D, flat.BAt)
	}
	cfg.LongContext = 200
	got, err := timeStepCosts(sleepEngine{newSimEngine(cost, nil)}, 512, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fitted %v + %v/member (at %d of context) + %v/member/context token", got.A, got.B, got.BAt, got.D)
	if math.Abs(float64(got.D-cost.D)) > 0.15*float64(cost.D) || got.BAt < costChunk || got.BAt > costChunk+20 {
		t.Errorf("D %v at %d of context, want about %v at 64-84", got.D, got.BAt, cost.D)
	}
	for _, c := range []float64{20, 100, 300, 600} {
		if g, w := got.TokenCost(8, c), engineCost(c); math.Abs(g-w) > 0.15*w {
			t.Errorf("at %.0f of context a token costs %.3g s by the fit, %.3g s on the engine", c, g, w)
		}
	}
}

// TestRateAtContext: a rate measured at a short mean context converts to
// a slower one at a longer, in the ratio of the lanes' modelled rates;
// lanes with no D leave it alone.
func TestRateAtContext(t *testing.T) {
	lane := StepCosts{A: 8 * time.Millisecond, B: time.Millisecond, D: 10 * time.Microsecond, BAt: 100}
	// At batch 8: 2 ms a token at context 100, 4 ms at 300, 1.5 at 50.
	for _, tc := range []struct{ from, to, want float64 }{{100, 300, 500}, {300, 100, 2000}, {100, 50, 1333.33}, {100, 100, 1000}} {
		if got := RateAtContext(1000, tc.from, tc.to, []StepCosts{lane, lane}, 8); math.Abs(got-tc.want) > 0.01 {
			t.Errorf("1000 tok/s at %.0f of context is %.2f at %.0f, want %.2f", tc.from, got, tc.to, tc.want)
		}
	}
	flat := lane
	flat.D = 0
	if got := RateAtContext(1000, 100, 300, []StepCosts{flat}, 8); got != 1000 {
		t.Errorf("lanes without D: %v, want the rate unchanged", got)
	}
}

func TestAtContext(t *testing.T) {
	lane := StepCosts{A: 8 * time.Millisecond, B: time.Millisecond, C: 50 * time.Microsecond, D: 10 * time.Microsecond, BAt: 100, MaxSeqs: 16, Context: 512}
	// A member at 300 of context: 1 ms + 200 × 10 µs = 3 ms; at 50, 0.5 ms.
	for _, tc := range []struct {
		context float64
		b       time.Duration
	}{{300, 3 * time.Millisecond}, {50, 500 * time.Microsecond}, {100, time.Millisecond}, {-1000, 0}} {
		got := lane.AtContext(tc.context)
		if got.B != tc.b || got.D != 0 || got.BAt != 0 || got.A != lane.A || got.C != lane.C || got.MaxSeqs != 16 || got.Context != 512 {
			t.Errorf("at %.0f of context: %+v, want B %v and the rest unchanged without D", tc.context, got, tc.b)
		}
		if tc.b > 0 {
			if a, b := got.TokenCost(8, 0), lane.TokenCost(8, tc.context); math.Abs(a-b) > 1e-12 {
				t.Errorf("at %.0f of context a token costs %g, but %g priced by TokenCost", tc.context, a, b)
			}
		}
	}
	flat := lane
	flat.D = 0
	if got := flat.AtContext(300); got != flat {
		t.Errorf("costs without D: %+v, want them unchanged", got)
	}
}

func TestResponseFloorByHand(t *testing.T) {
	// One lane, one member per step, 1 s per decoded token, free prefill:
	// request i needs (tokens-1) seconds of lane time.
	lane := StepCosts{B: time.Second}
	none := func(string) int { return 0 }
	reqs := []WorkRequest{
		{Arrival: 0, Natural: 11, MaxTokens: 11},                             // 10 s
		{Arrival: 0, Natural: 21, MaxTokens: 40},                             // 20 s
		{Arrival: 5 * time.Second, Natural: 31, MaxTokens: 31},               // 30 s
		{Arrival: 6 * time.Second, Natural: 50, MaxTokens: 50, MinTokens: 6}, // 5 s mandatory
	}
	// q = 1: all four must finish; by 6 s 65 s of work arrived, so the
	// last one ends at 65 s at best, 59 s after it arrived.
	if got := ResponseFloor(reqs, []StepCosts{lane}, 1, 1, none); got != 59*time.Second {
		t.Errorf("max response floor %v, want 59s", got)
	}
	// q = 0 lets the slowest 3 of 4 go: the bound drops to the time the
	// shortest request needs for its own tokens.
	if got := ResponseFloor(reqs, []StepCosts{lane}, 1, 0, none); got != 5*time.Second {
		t.Errorf("min response floor %v, want 5s", got)
	}
	// Two lanes halve the work's span (69 s by 6 s: 28.5 s), and then the
	// longest request's own 30 tokens plus a 1 s prefill bind instead.
	one := func(string) int { return 1 }
	lane.C = time.Second
	if got := ResponseFloor(reqs, []StepCosts{lane, lane}, 1, 1, one); got != 31*time.Second {
		t.Errorf("two-lane floor %v, want 31s", got)
	}
	// With a per-step cost, a full batch shares it: 8 members pay A/8 each.
	lane = StepCosts{A: 8 * time.Second, B: time.Second}
	if got := ResponseFloor(reqs[:1], []StepCosts{lane}, 8, 1, none); got != 8*time.Second+10*9*time.Second {
		t.Errorf("one request's floor %v, want its own 98s", got)
	}
	burst := make([]WorkRequest, 16)
	for i := range burst {
		burst[i] = WorkRequest{Natural: 11, MaxTokens: 11}
	}
	if got := ResponseFloor(burst, []StepCosts{lane}, 8, 1, none); got != 16*10*2*time.Second {
		t.Errorf("a burst's floor %v, want 320s (16 × 10 tokens × (8/8+1) s)", got)
	}
	// Lanes that differ add their rates: a lane at 1 s a token beside one
	// at 3 s decode 4/3 tokens a second together, so the 65 s of work that
	// arrived by 6 s takes 48.75 s (the fast lane 48.75 tokens, the slow
	// 16.25), 42.75 s after the last arrival. Each request's own tokens
	// count on the faster lane: 30 s for the longest.
	fast, slow := StepCosts{B: time.Second}, StepCosts{B: 3 * time.Second}
	if got := ResponseFloor(reqs, []StepCosts{fast, slow}, 1, 1, none); got != 42750*time.Millisecond {
		t.Errorf("a fast and a slow lane: floor %v, want 42.75s", got)
	}
	if got := ResponseFloor(reqs, []StepCosts{slow, fast}, 1, 0, none); got != 5*time.Second {
		t.Errorf("a slow and a fast lane, q = 0: floor %v, want the shortest request's 5s on the fast lane", got)
	}
	// Prefill counts at the lowest ratio of prefill to decode time among
	// the lanes: both prefill a token in 1 s, a third of the slow lane's
	// decoded token and all of the fast lane's, so a prompt token is worth
	// a third of a decoded one: (65 + 4/3) tokens at 4/3 a second.
	fast.C, slow.C = time.Second, time.Second
	if got, want := ResponseFloor(reqs, []StepCosts{fast, slow}, 1, 1, one), time.Duration((65+4.0/3)/(4.0/3)*float64(time.Second))-6*time.Second; got != want {
		t.Errorf("with prefill: floor %v, want %v", got, want)
	}
	// A member that costs 0.1 s more per token of context: the 11 tokens
	// of the first request follow 0 to 10 tokens, 5 on average, so each
	// costs 1.5 s and its 10 decoded tokens 15 s.
	ctxLane := StepCosts{B: time.Second, D: 100 * time.Millisecond}
	if got := ResponseFloor(reqs[:1], []StepCosts{ctxLane}, 1, 1, none); got != 15*time.Second {
		t.Errorf("a lane whose members cost more the longer their context: floor %v, want 15s", got)
	}
}

func TestResponseFloorHoldsForEveryPolicy(t *testing.T) {
	// The floor is a bound on every schedule: no simulated policy may
	// beat it, at light load or in overload.
	// Two alike lanes, and a lane three times slower beside a fast one.
	slow := simLane
	slow.A, slow.B, slow.C = 3*slow.A, 3*slow.B, 3*slow.C
	for _, lanes := range [][]StepCosts{{simLane, simLane}, {simLane, slow}} {
		for _, load := range []float64{0.3, 1.5} {
			for _, p := range sched.Policies() {
				run := simRunLanes(t, p, load, lanes)
				reqs := make([]WorkRequest, len(run.Outcomes))
				for i, o := range run.Outcomes {
					reqs[i] = o.Req
				}
				floor := ResponseFloor(reqs, lanes, 8, 0.99, nil)
				maxFloor := ResponseFloor(reqs, lanes, 8, 1, nil)
				row := Summarize(run)
				if floor <= 0 || row.P99 < floor {
					t.Errorf("%v on %d lanes %v at load %.1f: p99 %v below the floor %v", p, len(lanes), lanes[1].B, load, row.P99, floor)
				}
				if maxFloor < floor || row.Max < maxFloor {
					t.Errorf("%v on lanes %v at load %.1f: slowest response %v below its floor %v (p99 floor %v)", p, lanes[1].B, load, row.Max, maxFloor, floor)
				}
			}
		}
	}
}

// sleepEngine is the simulator's engine in real time: each step sleeps
// for its cost, so a live scheduler on it has a known capacity.
type sleepEngine struct{ *simEngine }

func (e sleepEngine) Step(ctx context.Context, members []sched.Member, out []sched.StepOut) error {
	err := e.simEngine.Step(ctx, members, out)
	time.Sleep(e.last)
	return err
}

// pacedEngine is the simulator's engine in real time, like sleepEngine,
// but keeping its lane's pace on a busy machine: a step that starts late,
// because the last sleep overshot or the goroutine waited for a CPU,
// sleeps that much less, so the lane decodes at its nominal capacity over
// a run and tests can compare a live rate with that. At most two steps of
// lateness are made up, so a lane idle between bursts gains no more than
// two free steps.
type pacedEngine struct {
	*simEngine
	due *time.Time // when the lane's last step should have ended
}

func newPacedEngine(cost StepCosts, natural map[string]int) pacedEngine {
	return pacedEngine{newSimEngine(cost, natural), new(time.Time)}
}

func (e pacedEngine) Step(ctx context.Context, members []sched.Member, out []sched.StepOut) error {
	err := e.simEngine.Step(ctx, members, out)
	e.pace(e.last)
	return err
}

// pace sleeps until d after the last step's due end, or after now less
// two steps when the lane has fallen further behind.
func (e pacedEngine) pace(d time.Duration) {
	now := time.Now()
	if floor := now.Add(-2 * d); e.due.Before(floor) {
		*e.due = floor
	}
	*e.due = e.due.Add(d)
	time.Sleep(time.Until(*e.due))
}

// burstWithTail is 32 requests of 40 tokens and, last in, one of tail
// tokens, on two lanes of 2 ms + 0.25 ms per member: 8 members decode
// 2000 tokens/s per lane, one alone 444.
func burstWithTail(t *testing.T, tail int) (*sched.Scheduler, []sched.Request, StepCosts) {
	t.Helper()
	cost := StepCosts{A: 2 * time.Millisecond, B: 250 * time.Microsecond, MaxSeqs: 16, Context: 4096}
	var burst []sched.Request
	natural := map[string]int{}
	for i := range 33 {
		n := 40
		if i == 32 {
			n = tail
		}
		id := fmt.Sprint(i)
		natural[id] = n
		burst = append(burst, sched.Request{ID: id, Prompt: []int32{1}, MaxTokens: n})
	}
	lanes := []sched.Lane{{Engine: newPacedEngine(cost, natural)}, {Engine: newPacedEngine(cost, natural)}}
	s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxBatch: 8}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s, burst, cost
}

func TestLiveThroughputCountsOnlyFullBatches(t *testing.T) {
	s, burst, cost := burstWithTail(t, 200) // the last drains alone for most of its length
	start := time.Now()
	d, err := LiveThroughput(context.Background(), s, burst)
	if err != nil {
		t.Fatal(err)
	}
	got := d.Rate
	// The full batches decode 40-token answers to one-token prompts: their
	// tokens follow 1 to 40 tokens of context, about 20 on average.
	if d.Context < 15 || d.Context > 30 {
		t.Errorf("the full batches' tokens followed %.1f tokens of context on average, want about 20", d.Context)
	}
	whole := float64(s.Stats().Tokens) / time.Since(start).Seconds()
	// The long request's drain, alone at the end, would pull a plain
	// average over the whole burst to about 2200 tokens/s (LiveThroughput
	// now cancels that tail: TestLiveThroughputCancelsTheTail).
	capacity := 2 * cost.Capacity(8)
	t.Logf("throughput %.0f tokens/s while the batches were full, %.0f over the whole burst, capacity %.0f", got, whole, capacity)
	if got < 0.75*capacity || got > 1.1*capacity {
		t.Errorf("throughput %.0f tokens/s, want about the full-batch capacity %.0f (the whole burst: %.0f)", got, capacity, whole)
	}
}

// TestLiveThroughputCancelsTheTail: once the queue has run dry the
// requests still running are cancelled, and the call returns with the
// lanes free; the throughput is still that of the full batches.
func TestLiveThroughputCancelsTheTail(t *testing.T) {
	s, burst, cost := burstWithTail(t, 4000) // about 9 s alone: far longer than the full batches last
	d, err := LiveThroughput(context.Background(), s, burst)
	if err != nil {
		t.Fatal(err)
	}
	got := d.Rate
	st := s.Stats()
	if st.Cancelled == 0 || st.Completed+st.Cancelled != uint64(len(burst)) {
		t.Errorf("%d completed and %d cancelled of %d: want the long tail cancelled and every stream ended", st.Completed, st.Cancelled, len(burst))
	}
	for _, l := range st.Lanes {
		if l.Running != 0 {
			t.Errorf("lane %s still runs %d requests after the burst", l.Name, l.Running)
		}
	}
	if capacity := 2 * cost.Capacity(8); got < 0.75*capacity || got > 1.1*capacity {
		t.Errorf("throughput %.0f tokens/s, want about the full-batch capacity %.0f", got, capacity)
	}
}

// slowStartEngine is a pacedEngine whose first slow steps take four
// times their cost: a shared machine's slow spell.
type slowStartEngine struct {
	pacedEngine
	slow *atomic.Int32
}

func (e slowStartEngine) Step(ctx context.Context, members []sched.Member, out []sched.StepOut) error {
	err := e.simEngine.Step(ctx, members, out)
	d := e.last
	if e.slow.Add(-1) >= 0 {
		d *= 4
	}
	e.pace(d)
	return err
}

// TestLiveCapacityTakesTheFastestBurst: a slow spell over the first
// burst and part of the second does not lower the capacity, where the
// first burst alone, or the mean or median of three, would.
func TestLiveCapacityTakesTheFastestBurst(t *testing.T) {
	cost := StepCosts{A: 2 * time.Millisecond, B: 250 * time.Microsecond, MaxSeqs: 16, Context: 2048}
	var burst []sched.Request
	for range 32 {
		burst = append(burst, sched.Request{Prompt: []int32{1}, MaxTokens: 40})
	}
	// About 40 full-batch steps per lane and burst: slow for 60 of them.
	var slow [2]atomic.Int32
	var lanes []sched.Lane
	for i := range slow {
		slow[i].Store(60)
		lanes = append(lanes, sched.Lane{Engine: slowStartEngine{newPacedEngine(cost, nil), &slow[i]}})
	}
	s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxBatch: 8}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	d, err := LiveCapacity(context.Background(), s, burst, 3)
	if err != nil {
		t.Fatal(err)
	}
	got := d.Rate
	capacity := 2 * cost.Capacity(8)
	t.Logf("capacity %.0f tokens/s measured, %.0f at full batch", got, capacity)
	if got < 0.75*capacity || got > 1.1*capacity {
		t.Errorf("capacity %.0f tokens/s, want about the full-batch %.0f: the fastest burst, not a slow one", got, capacity)
	}
}

// TestAtCapacityRerunsWhenTheProbeWasLow: runs are repeated once, from
// the second probe, only when it reads more than CapacityDrift above the
// figure they used; a lower or close second probe keeps them, and a
// third probe never starts a third round.
func TestAtCapacityRerunsWhenTheProbeWasLow(t *testing.T) {
	// Each probe's context differs, so the capacity keeps the one that
	// came with the rate it used.
	d := func(rate float64) Decoded { return Decoded{Rate: rate, Context: rate / 10} }
	for _, tc := range []struct {
		name   string
		probes []float64
		used   []float64 // the capacities runs was called with
		want   Capacity
	}{
		{"steady", []float64{1000, 1050}, []float64{1000}, Capacity{First: d(1000), Used: d(1000), After: d(1050)}},
		{"at the drift", []float64{1000, 1100}, []float64{1000}, Capacity{First: d(1000), Used: d(1000), After: d(1100)}},
		{"slower after", []float64{1000, 700}, []float64{1000}, Capacity{First: d(1000), Used: d(1000), After: d(700)}},
		{"low first probe", []float64{1000, 1300, 1290}, []float64{1000, 1300}, Capacity{First: d(1000), Used: d(1300), After: d(1290), Rerun: true}},
		{"rising twice", []float64{1000, 1300, 1700}, []float64{1000, 1300}, Capacity{First: d(1000), Used: d(1300), After: d(1700), Rerun: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probes := tc.probes
			probe := func() (Decoded, error) {
				if len(probes) == 0 {
					t.Fatal("probed more often than the case allows")
				}
				c := probes[0]
				probes = probes[1:]
				return d(c), nil
			}
			var used []float64
			got, err := AtCapacity(probe, func(c float64) error { used = append(used, c); return nil })
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || !slices.Equal(used, tc.used) || len(probes) != 0 {
				t.Errorf("AtCapacity = %+v with runs at %v and %d probes left, want %+v with runs at %v and none left", got, used, len(probes), tc.want, tc.used)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		boom := errors.New("boom")
		if _, err := AtCapacity(func() (Decoded, error) { return Decoded{}, boom }, func(float64) error { t.Error("ran after a failed probe"); return nil }); !errors.Is(err, boom) {
			t.Errorf("probe error: got %v", err)
		}
		if _, err := AtCapacity(func() (Decoded, error) { return d(1), nil }, func(float64) error { return boom }); !errors.Is(err, boom) {
			t.Errorf("runs error: got %v", err)
		}
	})
}

func TestMedianRowTakesEachMeasuresMedian(t *testing.T) {
	row := func(p99 time.Duration, attain, overhead float64, shed int) SchedRow {
		return SchedRow{Engine: "e", Policy: "tandem", Load: 1.6, Adversarial: 0.2, Deadlines: 50,
			P99: p99, Mean: p99 / 2, Attainment: attain, Overhead: overhead, LaneOverhead: overhead / 2, ShedTokens: shed,
			SchedPerRequest: time.Duration(overhead * float64(time.Millisecond)), TokensPerStep: float64(shed) / 100}
	}
	// A stalled run (the third) sets neither the p99 nor the overhead.
	m := MedianRow([]SchedRow{row(3*time.Second, 90, 0.9, 100), row(2*time.Second, 80, 1.0, 300), row(9*time.Second, 85, 2.9, 200)})
	if m.P99 != 3*time.Second || m.Mean != 1500*time.Millisecond || m.Attainment != 85 || m.Overhead != 1.0 || m.LaneOverhead != 0.5 || m.ShedTokens != 200 ||
		m.SchedPerRequest != time.Millisecond || m.TokensPerStep != 2 {
		t.Errorf("median row %+v", m)
	}
	if m.Runs != 3 || m.Engine != "e" || m.Policy != "tandem" || m.Load != 1.6 || m.Deadlines != 50 {
		t.Errorf("setting not kept: %+v", m)
	}
	// An even count takes the middle two's mean.
	if m := MedianRow([]SchedRow{row(2*time.Second, 80, 1, 0), row(4*time.Second, 90, 3, 0)}); m.P99 != 3*time.Second || m.Overhead != 2 {
		t.Errorf("median of two: p99 %v overhead %v", m.P99, m.Overhead)
	}
	if m := MedianRow(nil); m.Runs != 0 {
		t.Errorf("median of none: %+v", m)
	}
}

// TestMeasuredWorkRecoversTheAnswers: from a simulated FIFO run, which
// sheds nothing, and a tandem run, which sheds, MeasuredWork finds each
// request's answer as the simulator's model ended it, so the floor from
// the measured work is the floor from the workload itself.
func TestMeasuredWorkRecoversTheAnswers(t *testing.T) {
	fifo := simRun(t, sched.FIFO, 1.5)
	tandem := simRun(t, sched.Tandem, 1.5)
	if Summarize(tandem).ShedTokens == 0 {
		t.Fatal("tandem shed nothing: the test needs shed requests")
	}
	reqs := make([]WorkRequest, len(fifo.Outcomes))
	for i, o := range fifo.Outcomes {
		reqs[i] = o.Req
	}
	got, err := MeasuredWork(reqs, []Run{tandem, fifo})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		if want := min(reqs[i].Natural, reqs[i].MaxTokens); r.Natural != want {
			t.Errorf("request %s: measured %d tokens, the model's answer is %d", r.ID, r.Natural, want)
		}
	}
	lanes := []StepCosts{simLane, simLane}
	if a, b := ResponseFloor(got, lanes, 8, 1, nil), ResponseFloor(reqs, lanes, 8, 1, nil); a != b {
		t.Errorf("floor from the measured work %v, from the workload %v", a, b)
	}
}

func TestMeasuredWorkUndercountsWhatNoRunFinished(t *testing.T) {
	reqs := []WorkRequest{{ID: "a", Natural: 99}, {ID: "b", Natural: 99}, {ID: "c", Natural: 99}}
	run := func(a, b, c sched.Reason, na, nb, nc int) Run {
		return Run{Policy: "p", Outcomes: []Outcome{
			{Req: reqs[2], Result: sched.Result{Reason: c, TotalGenerated: nc}}, // any order
			{Req: reqs[0], Result: sched.Result{Reason: a, TotalGenerated: na}},
			{Req: reqs[1], Result: sched.Result{Reason: b, TotalGenerated: nb}},
		}}
	}
	runs := []Run{
		run(sched.ReasonStop, sched.ReasonShed, sched.ReasonCancelled, 12, 5, 7),
		run(sched.ReasonStop, sched.ReasonShed, sched.ReasonShed, 11, 8, 3),
		run(sched.ReasonShed, sched.ReasonLength, sched.ReasonShed, 4, 30, 2),
	}
	got, err := MeasuredWork(reqs, runs)
	if err != nil {
		t.Fatal(err)
	}
	// a: the fewer of its finished answers; b: its one finished answer,
	// not its longer shed ones; c: never finished, the most it got.
	for i, want := range []int{11, 30, 7} {
		if got[i].Natural != want {
			t.Errorf("request %s: %d tokens, want %d", got[i].ID, got[i].Natural, want)
		}
	}
	if reqs[0].Natural != 99 {
		t.Error("MeasuredWork changed its argument")
	}
	if _, err := MeasuredWork(reqs, []Run{{Policy: "p", Outcomes: runs[0].Outcomes[:2]}}); err == nil {
		t.Error("a run missing a request: no error")
	}
	other := runs[0]
	other.Outcomes = slices.Clone(other.Outcomes)
	other.Outcomes[0].Req.ID = "z"
	if _, err := MeasuredWork(reqs, []Run{other}); err == nil {
		t.Error("a run holding another workload's request: no error")
	}
}

// TestCapacityLanesSpreadTheLiveRate: the lanes' full-batch rates add up
// to the live capacity, shared as the lanes' rates in isolation are.
func TestCapacityLanesSpreadTheLiveRate(t *testing.T) {
	fast := StepCosts{Name: "gpu", A: 8 * time.Millisecond, B: time.Millisecond, MaxSeqs: 16, Context: 512}
	slow := StepCosts{Name: "cpu", A: 24 * time.Millisecond, B: 3 * time.Millisecond, MaxSeqs: 16, Context: 512}
	got := CapacityLanes(2000, []StepCosts{fast, slow}, 8)
	if len(got) != 2 || got[0].Name != "gpu" || got[1].Context != 512 {
		t.Fatalf("lanes %+v", got)
	}
	// Alone at batch 8 they decode 2000 and 666.7 tokens/s: three to one.
	for i, want := range []float64{1500, 500} {
		if got[i].A != 0 || got[i].C != 0 || math.Abs(got[i].Capacity(8)-want) > 0.01 {
			t.Errorf("lane %d: %+v decodes %.2f tokens/s at full batch, want %v from the per-member cost alone", i, got[i], got[i].Capacity(8), want)
		}
	}
}

// TestLiveMeanTokensCountsTheModelsAnswers: the mean is of where the
// model ended each answer, or its budget did, not of the budgets asked.
func TestLiveMeanTokensCountsTheModelsAnswers(t *testing.T) {
	cost := StepCosts{A: time.Microsecond, B: time.Microsecond, MaxSeqs: 16, Context: 4096}
	natural := map[string]int{"a": 10, "b": 20, "c": 30, "d": 50}
	budget := map[string]int{"a": 100, "b": 100, "c": 100, "d": 5}
	var reqs []sched.Request
	for _, id := range []string{"a", "b", "c", "d"} {
		reqs = append(reqs, sched.Request{ID: id, Prompt: []int32{1, 2}, MaxTokens: budget[id], StopTokens: []int32{simEOS}})
	}
	lanes := []sched.Lane{{Engine: newSimEngine(cost, natural)}, {Engine: newSimEngine(cost, natural)}}
	s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxBatch: 8}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	got, err := LiveMeanTokens(context.Background(), s, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(10+20+30+5) / 4; got != want {
		t.Errorf("mean %v tokens, want %v", got, want)
	}
	if _, err := LiveMeanTokens(context.Background(), s, nil); err == nil {
		t.Error("no requests: no error")
	}
}

// TestFastestCapacityProbesSmallerBatches: every power of two below the
// cap is probed once, and the fastest wins, full batch included.
func TestFastestCapacityProbesSmallerBatches(t *testing.T) {
	read := map[int]float64{1: 5, 2: 9, 4: 7}
	var probed []int
	probe := func(mb int) (float64, error) {
		probed = append(probed, mb)
		return read[mb], nil
	}
	if best, batch, err := FastestCapacity(8, 8, probe); err != nil || best != 9 || batch != 2 {
		t.Errorf("FastestCapacity = %v at %d (%v), want 9 at 2", best, batch, err)
	}
	if !slices.Equal(probed, []int{1, 2, 4}) {
		t.Errorf("probed caps %v, want 1, 2, 4", probed)
	}
	if best, batch, _ := FastestCapacity(10, 6, probe); best != 10 || batch != 6 {
		t.Errorf("full batch fastest: %v at %d, want 10 at 6", best, batch)
	}
	if best, batch, _ := FastestCapacity(10, 1, probe); best != 10 || batch != 1 {
		t.Errorf("a cap of 1: %v at %d, want the full batch's 10 at 1", best, batch)
	}
	fail := errors.New("lane down")
	if _, _, err := FastestCapacity(10, 8, func(int) (float64, error) { return 0, fail }); !errors.Is(err, fail) {
		t.Errorf("probe error %v, want %v", err, fail)
	}
}
