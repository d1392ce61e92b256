package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// SchedRow summarizes one run.
type SchedRow struct {
	Engine      string  // "real" or "sim <shape>"
	Policy      string  // policy, with a suffix for ablations
	Load        float64 // offered load: arrival rate × mean tokens ÷ capacity
	Rate        float64 // arrivals per second
	Adversarial float64
	Variance    string
	Requests    int

	Mean, P50, P99 time.Duration // response time, arrival to last token
	Max            time.Duration // the slowest request's response time
	// P99Floor is ResponseFloor's bound on the p99 for the run's workload
	// (simulated runs; 0 where unknown).
	P99Floor time.Duration
	// MaxFloor is ResponseFloor's bound on the slowest response (q = 1):
	// every schedule of the workload has a request at least this slow.
	MaxFloor time.Duration
	// RunP99Floor and RunMaxFloor are the same bounds at the fastest rate
	// a run of the setting decoded over its arrivals or its drain
	// (BestRate) instead of a probe's (real engine; 0 elsewhere). A probe
	// submits its burst before the lanes start; in a run the clients
	// share the machine with the lanes, and on a 2-vCPU VM no run of
	// stories260K came within 4% of the probe's rate, so the probe's
	// floors promised cuts that no schedule reached.
	RunP99Floor, RunMaxFloor time.Duration
	// Drain is the time from the last arrival to the last finish. Under
	// sustained overload it is what the backlog left when arrivals stop
	// takes to serve, and a p99 near it says the tail is that backlog,
	// not the order: the last request to finish waits at least Drain.
	Drain      time.Duration
	Throughput float64 // finished requests per second
	TokPerS    float64
	Deadlines  int     // requests with a deadline
	Attainment float64 // share of them that finished by it (%)
	Utility    float64 // achieved ÷ attainable time-utility (%)
	ShedTokens int
	Overhead   float64 // scheduler wall time ÷ engine time (%)
	// LaneOverhead is the part of Overhead spent in the lanes' sections
	// (delivery and planning, once per step); the rest is the intake's
	// (scoring and queueing, once per request).
	LaneOverhead float64
	// SchedPerRequest is the scheduler's time per request. Unlike
	// Overhead it does not grow when the engine does less: a policy that
	// sheds optional tokens divides the same per-request work by less
	// engine time.
	SchedPerRequest time.Duration
	// TokensPerStep is the tokens generated per engine step, all lanes:
	// the mean batch, pulled a little below it by steps that only
	// prefilled. The lanes' part of the overhead is paid per step.
	TokensPerStep float64
	// Runs is how many runs the row is the median of (MedianRow; 0: one).
	Runs int `json:",omitempty"`
}

// MedianRow combines repeated runs of one setting: each measure is its
// median over the runs, so one run a busy machine stalled does not set
// the figure (on a shared two-core machine a single real-engine run's p99
// and overhead vary by a third). The setting's fields come from rows[0].
func MedianRow(rows []SchedRow) SchedRow {
	if len(rows) == 0 {
		return SchedRow{}
	}
	r := rows[0]
	r.Runs = len(rows)
	med := func(get func(SchedRow) float64) float64 {
		xs := make([]float64, len(rows))
		for i, x := range rows {
			xs[i] = get(x)
		}
		slices.Sort(xs)
		return schedPercentile(xs, 0.5)
	}
	dur := func(get func(SchedRow) time.Duration) time.Duration {
		return time.Duration(med(func(x SchedRow) float64 { return float64(get(x)) }))
	}
	r.Mean = dur(func(x SchedRow) time.Duration { return x.Mean })
	r.P50 = dur(func(x SchedRow) time.Duration { return x.P50 })
	r.P99 = dur(func(x SchedRow) time.Duration { return x.P99 })
	r.Max = dur(func(x SchedRow) time.Duration { return x.Max })
	r.P99Floor = dur(func(x SchedRow) time.Duration { return x.P99Floor })
	r.MaxFloor = dur(func(x SchedRow) time.Duration { return x.MaxFloor })
	r.RunP99Floor = dur(func(x SchedRow) time.Duration { return x.RunP99Floor })
	r.RunMaxFloor = dur(func(x SchedRow) time.Duration { return x.RunMaxFloor })
	r.Drain = dur(func(x SchedRow) time.Duration { return x.Drain })
	r.Throughput = med(func(x SchedRow) float64 { return x.Throughput })
	r.TokPerS = med(func(x SchedRow) float64 { return x.TokPerS })
	r.Attainment = med(func(x SchedRow) float64 { return x.Attainment })
	r.Utility = med(func(x SchedRow) float64 { return x.Utility })
	r.ShedTokens = int(math.Round(med(func(x SchedRow) float64 { return float64(x.ShedTokens) })))
	r.Overhead = med(func(x SchedRow) float64 { return x.Overhead })
	r.LaneOverhead = med(func(x SchedRow) float64 { return x.LaneOverhead })
	r.SchedPerRequest = dur(func(x SchedRow) time.Duration { return x.SchedPerRequest })
	r.TokensPerStep = med(func(x SchedRow) float64 { return x.TokensPerStep })
	return r
}

// Summarize computes a run's row.
func Summarize(run Run) SchedRow {
	r := SchedRow{Policy: run.Policy, Requests: len(run.Outcomes)}
	var resp []float64
	var tokens, met int
	var util, maxUtil float64
	for _, o := range run.Outcomes {
		res := o.Result
		resp = append(resp, o.Response.Seconds())
		tokens += res.TotalGenerated
		r.ShedTokens += res.ShedTokens
		maxUtil += o.Req.Utility
		util += res.Utility
		if res.HasDeadline {
			r.Deadlines++
			if res.DeadlineMet {
				met++
			}
		}
	}
	if len(resp) > 0 {
		slices.Sort(resp)
		var sum float64
		for _, x := range resp {
			sum += x
		}
		sec := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
		r.Mean = sec(sum / float64(len(resp)))
		r.P50 = sec(schedPercentile(resp, 0.50))
		r.P99 = sec(schedPercentile(resp, 0.99))
		r.Max = sec(resp[len(resp)-1])
	}
	_, lastArrival, lastFinish := runSpan(run.Outcomes)
	r.Drain = max(0, lastFinish.Sub(lastArrival))
	if s := run.Makespan.Seconds(); s > 0 {
		r.Throughput = float64(len(run.Outcomes)) / s
		r.TokPerS = float64(tokens) / s
	}
	if r.Deadlines > 0 {
		r.Attainment = 100 * float64(met) / float64(r.Deadlines)
	}
	if maxUtil > 0 {
		r.Utility = 100 * util / maxUtil
	}
	if run.Engine > 0 {
		r.Overhead = 100 * run.SchedWall.Seconds() / run.Engine.Seconds()
		r.LaneOverhead = 100 * (run.SchedWall - run.IntakeWall).Seconds() / run.Engine.Seconds()
	}
	if len(run.Outcomes) > 0 {
		r.SchedPerRequest = run.SchedWall / time.Duration(len(run.Outcomes))
	}
	if run.Steps > 0 {
		r.TokensPerStep = float64(tokens) / float64(run.Steps)
	}
	return r
}

// percentile interpolates the q-quantile of ascending s.
func schedPercentile(s []float64, q float64) float64 {
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// SchedTable renders rows as a markdown table.
func SchedTable(rows []SchedRow) string {
	var b strings.Builder
	b.WriteString("| engine | adv. | var. | load | req/s | policy | mean s | p50 s | p99 s | done/s | tok/s | tok/step | deadlines met | utility | shed tok | sched overhead | sched µs/req |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.0f%% | %s | %.2f | %.2f | %s | %.3f | %.3f | %.3f | %.2f | %.0f | %.2f | %.1f%% (%d) | %.1f%% | %d | %.3f%% | %.1f |\n",
			r.Engine, 100*r.Adversarial, r.Variance, r.Load, r.Rate, r.Policy, r.Mean.Seconds(), r.P50.Seconds(), r.P99.Seconds(),
			r.Throughput, r.TokPerS, r.TokensPerStep, r.Attainment, r.Deadlines, r.Utility, r.ShedTokens, r.Overhead,
			float64(r.SchedPerRequest.Nanoseconds())/1e3)
	}
	return b.String()
}

// SchedGoal compares tandem with FIFO in the rows of one setting at its
// highest load: p99 reduction (%) and deadline attainment gain (points).
type SchedGoal struct {
	Engine, Variance          string
	Adversarial, Load         float64
	FIFOP99, TandemP99        time.Duration
	P99Floor                  time.Duration // no policy's p99 can be lower (0: unknown)
	MaxFloor                  time.Duration // no policy's slowest response can be lower (0: unknown)
	TandemDrain               time.Duration // tandem's SchedRow.Drain
	P99Reduction              float64
	FloorReduction            float64 // the floor's reduction from FIFO's p99 (%; 0 with no floor)
	MaxFloorReduction         float64 // MaxFloor's reduction from FIFO's p99 (%; 0 with no floor)
	FIFOAttain, TandemAttain  float64
	AttainmentGain            float64
	MaxOverhead               float64
	MetP99Goal, MetAttainGoal bool
	// P99OutOfReach: the floor itself is less than the goal below FIFO's
	// p99, so no policy meets the p99 goal on this workload.
	P99OutOfReach bool
	// P99NeedsHoldBack: MaxFloor is less than the goal below FIFO's p99.
	// A policy meeting the goal then has a p99 below the slowest response
	// every schedule has: it holds up to 1% of the requests back to finish
	// that much after the rest. One whose slowest requests finish together
	// at the end of the drain, as tandem's and FIFO's do, cannot get there.
	P99NeedsHoldBack bool
	// RunP99Floor and RunMaxFloor are tandem's row's floors at the runs'
	// best rate, with their reductions from FIFO's p99, and the two
	// verdicts above again for them (only where those above are false).
	RunP99Floor, RunMaxFloor                          time.Duration
	RunFloorReduction, RunMaxFloorReduction           float64
	P99OutOfReachAtRunRate, P99NeedsHoldBackAtRunRate bool
}

// The goals at overload: against FIFO, the p99 cut (%) and the
// deadline attainment gain (points); the scheduler's own time under
// overheadGoal % of inference time.
const (
	p99Goal      = 30
	attainGoal   = 20
	overheadGoal = 1
)

// Goals finds, per (engine, adversarial share, variance), the highest
// load and compares tandem with FIFO there against p99Goal and
// attainGoal.
func Goals(rows []SchedRow) []SchedGoal {
	type key struct {
		engine, variance string
		adv              float64
	}
	top := map[key]float64{}
	var keys []key
	for _, r := range rows {
		k := key{r.Engine, r.Variance, r.Adversarial}
		if _, ok := top[k]; !ok {
			keys = append(keys, k)
		}
		top[k] = math.Max(top[k], r.Load)
	}
	var out []SchedGoal
	for _, k := range keys {
		var g SchedGoal
		var fifo, tandem *SchedRow
		for i := range rows {
			r := &rows[i]
			if r.Engine != k.engine || r.Variance != k.variance || r.Adversarial != k.adv {
				continue
			}
			g.MaxOverhead = math.Max(g.MaxOverhead, r.Overhead)
			if r.Load != top[k] {
				continue
			}
			switch r.Policy {
			case sched.FIFO.String():
				fifo = r
			case sched.Tandem.String():
				tandem = r
			}
		}
		if fifo == nil || tandem == nil {
			continue
		}
		g.Engine, g.Variance, g.Adversarial, g.Load = k.engine, k.variance, k.adv, top[k]
		g.FIFOP99, g.TandemP99, g.P99Floor, g.MaxFloor, g.TandemDrain = fifo.P99, tandem.P99, tandem.P99Floor, tandem.MaxFloor, tandem.Drain
		g.RunP99Floor, g.RunMaxFloor = tandem.RunP99Floor, tandem.RunMaxFloor
		if fifo.P99 > 0 {
			cut := func(d time.Duration) float64 { return 100 * (1 - d.Seconds()/fifo.P99.Seconds()) }
			g.P99Reduction = cut(tandem.P99)
			if g.P99Floor > 0 {
				g.FloorReduction = cut(g.P99Floor)
				g.P99OutOfReach = g.FloorReduction < p99Goal
			}
			if g.MaxFloor > 0 {
				g.MaxFloorReduction = cut(g.MaxFloor)
				g.P99NeedsHoldBack = !g.P99OutOfReach && g.MaxFloorReduction < p99Goal
			}
			decided := g.P99OutOfReach || g.P99NeedsHoldBack
			if g.RunP99Floor > 0 {
				g.RunFloorReduction = cut(g.RunP99Floor)
				g.P99OutOfReachAtRunRate = !decided && g.RunFloorReduction < p99Goal
			}
			if g.RunMaxFloor > 0 {
				g.RunMaxFloorReduction = cut(g.RunMaxFloor)
				g.P99NeedsHoldBackAtRunRate = !decided && !g.P99OutOfReachAtRunRate && g.RunMaxFloorReduction < p99Goal
			}
		}
		g.FIFOAttain, g.TandemAttain = fifo.Attainment, tandem.Attainment
		g.AttainmentGain = tandem.Attainment - fifo.Attainment
		g.MetP99Goal = g.P99Reduction >= p99Goal
		g.MetAttainGoal = g.AttainmentGain >= attainGoal
		out = append(out, g)
	}
	return out
}

// floorCell is a goal row's floor with its reduction from FIFO's p99, or
// a dash where either is unknown.
func floorCell(g SchedGoal, floor time.Duration, reduction float64) string {
	if floor <= 0 || g.FIFOP99 <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f s (%.1f%%)", floor.Seconds(), reduction)
}

// GoalTable renders Goals as markdown.
func GoalTable(gs []SchedGoal) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| engine | adv. | var. | load | p99 FIFO → tandem | p99 reduction (goal ≥ %d%%) | p99 floor, any policy (reduction) | slowest-response floor, any policy (reduction) | p99 / slowest-response floors at the runs' best rate (reduction) | tandem's p99 ÷ its drain | deadlines met FIFO → tandem | gain (goal ≥ %d pts) | max sched overhead (goal < %d%%) |\n",
		p99Goal, attainGoal, overheadGoal)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	for _, g := range gs {
		p99 := mark(g.MetP99Goal)
		switch {
		case g.P99OutOfReach:
			p99 += " (out of any policy's reach)"
		case g.P99NeedsHoldBack:
			p99 += " (only by holding back the slowest 1%)"
		case g.P99OutOfReachAtRunRate:
			p99 += " (out of any policy's reach at the runs' decode rate)"
		case g.P99NeedsHoldBackAtRunRate:
			p99 += " (at the runs' decode rate, only by holding back the slowest 1%)"
		}
		floor, maxFloor := floorCell(g, g.P99Floor, g.FloorReduction), floorCell(g, g.MaxFloor, g.MaxFloorReduction)
		runFloors := "-"
		if g.RunP99Floor > 0 || g.RunMaxFloor > 0 {
			runFloors = floorCell(g, g.RunP99Floor, g.RunFloorReduction) + " / " + floorCell(g, g.RunMaxFloor, g.RunMaxFloorReduction)
		}
		drain := "-"
		if g.TandemDrain > 0 {
			drain = fmt.Sprintf("%.2f", g.TandemP99.Seconds()/g.TandemDrain.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %.0f%% | %s | %.2f | %.3f s → %.3f s | %.1f%% %s | %s | %s | %s | %s | %.1f%% → %.1f%% | %+.1f pts %s | %.3f%% %s |\n",
			g.Engine, 100*g.Adversarial, g.Variance, g.Load, g.FIFOP99.Seconds(), g.TandemP99.Seconds(), g.P99Reduction, p99,
			floor, maxFloor, runFloors, drain, g.FIFOAttain, g.TandemAttain, g.AttainmentGain, mark(g.MetAttainGoal), g.MaxOverhead, mark(g.MaxOverhead < overheadGoal))
	}
	return b.String()
}
