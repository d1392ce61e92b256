package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// StepCosts is a lane's step time: A + B·decoding members + C·prefill
// tokens, and D per token of each decoding member's context beyond BAt,
// measured on the real engine (MeasureStepCosts).
type StepCosts struct {
	Name string        `json:"name"`
	A    time.Duration `json:"a"` // per step
	B    time.Duration `json:"b"` // per decoding member
	C    time.Duration `json:"c"` // per prefill token
	// D is what a decoding member's share of a step grows by per token of
	// its context beyond BAt, the mean context B was measured at:
	// attention reads the whole KV cache. On stories260K a token at 450
	// of context costs three times one at 50. Zero where unmeasured (the
	// simulator's --sim-costs give none).
	D       time.Duration `json:"d,omitempty"`
	BAt     int           `json:"b_at,omitempty"`
	MaxSeqs int           `json:"max_seqs"`
	Context int           `json:"context"`
}

// Step is the duration of a step.
func (c StepCosts) Step(decode, prefill int) time.Duration {
	return c.A + time.Duration(decode)*c.B + time.Duration(prefill)*c.C
}

// TokenTime is one sequence's time per token decoding alone.
func (c StepCosts) TokenTime() time.Duration { return c.Step(1, 0) }

// Capacity is the most tokens per second a lane yields, at batch n.
func (c StepCosts) Capacity(n int) float64 { return float64(n) / c.Step(n, 0).Seconds() }

// TokenCost is the lane time, in seconds, a decoded token takes in a
// batch of n whose members follow context tokens each: the step's share
// and the member's cost at that context (AtContext).
func (c StepCosts) TokenCost(n int, context float64) float64 {
	at := c.AtContext(max(context, 0))
	return at.A.Seconds()/float64(max(n, 1)) + at.B.Seconds()
}

// AtContext is c with every decoding member priced at context tokens:
// D folded into B (and cleared; B less D below BAt, down to no cost at
// all), so Capacity and Step see what a lane decodes on a workload of
// that mean context. Costs without a D come back unchanged.
func (c StepCosts) AtContext(context float64) StepCosts {
	if c.D == 0 {
		return c
	}
	c.B = max(c.B+time.Duration(c.D.Seconds()*(context-float64(c.BAt))*float64(time.Second)), 0)
	c.D, c.BAt = 0, 0
	return c
}

// RateAtContext converts rate, what lanes decoded at full batch while
// their tokens followed from tokens of context on average, into what they
// would decode at a mean context of to: the rate scaled by the lanes'
// modelled full-batch rates at the two (TokenCost). Lanes without a
// measured D leave it unchanged.
func RateAtContext(rate, from, to float64, lanes []StepCosts, batch int) float64 {
	at := func(context float64) float64 {
		var r float64
		for _, l := range lanes {
			cost := l.TokenCost(batch, context)
			if cost <= 0 {
				return 0
			}
			r += 1 / cost
		}
		return r
	}
	rFrom, rTo := at(from), at(to)
	if rFrom <= 0 || rTo <= 0 {
		return rate
	}
	return rate * rTo / rFrom
}

const simEOS = 2

// simEngine is a sched.Engine that computes nothing: each step yields a
// token per decoding member (EOS once the request's natural length is
// reached) and costs what the measured StepCosts say.
type simEngine struct {
	costs   StepCosts
	natural map[string]int
	emitted map[string]int // by request, across evictions
	seqs    map[sched.SeqID]*simSeq
	next    sched.SeqID
	chunk   int
	last    time.Duration // the cost of the last Step
	busy    time.Duration // total simulated step time
}

type simSeq struct {
	tag     string
	pending int
	context int // tokens evaluated so far
	tok     [1]int32
}

func newSimEngine(c StepCosts, natural map[string]int) *simEngine {
	if c.MaxSeqs <= 0 {
		c.MaxSeqs = 16
	}
	if c.Context <= 0 {
		c.Context = 2048
	}
	return &simEngine{costs: c, natural: natural, emitted: map[string]int{}, seqs: map[sched.SeqID]*simSeq{}, chunk: 64}
}

func (e *simEngine) Info() sched.EngineInfo {
	return sched.EngineInfo{Name: e.costs.Name, MaxSeqs: e.costs.MaxSeqs, Context: e.costs.Context, SeqBytes: 1}
}

func (e *simEngine) Start(tokens []int32, _ *sample.Sampler, tag string) (sched.SeqID, error) {
	if len(e.seqs) >= e.costs.MaxSeqs {
		return 0, fmt.Errorf("sim: all %d sequences in use", e.costs.MaxSeqs)
	}
	e.next++
	e.seqs[e.next] = &simSeq{tag: tag, pending: len(tokens)}
	return e.next, nil
}

func (e *simEngine) Free(id sched.SeqID) error {
	delete(e.seqs, id)
	return nil
}

func (e *simEngine) Step(_ context.Context, members []sched.Member, out []sched.StepOut) error {
	budget := e.chunk
	decode, prefill := 0, 0
	var beyond int // decoding members' context past BAt, summed
	for i, m := range members {
		s := e.seqs[m.Seq]
		out[i] = sched.StepOut{}
		if s == nil {
			out[i].Err = fmt.Errorf("sim: unknown sequence %d", m.Seq)
			continue
		}
		if s.pending > 1 {
			n := min(s.pending, budget)
			budget -= n
			s.pending -= n
			s.context += n
			out[i].Prefilled = n
			prefill += n
			if s.pending > 0 || n == 0 {
				continue
			}
		} else if s.pending == 1 {
			s.pending = 0
			s.context++
			out[i].Prefilled = 1
			prefill++
		} else {
			decode++
			beyond += s.context - e.costs.BAt
			s.context++
		}
		k := e.emitted[s.tag]
		if n, ok := e.natural[s.tag]; ok && k >= n {
			s.tok[0] = simEOS
		} else {
			s.tok[0] = int32(100 + k%300)
			e.emitted[s.tag] = k + 1
		}
		out[i].Tokens = s.tok[:]
	}
	e.last = max(e.costs.Step(decode, prefill)+time.Duration(beyond)*e.costs.D, e.costs.A)
	e.busy += e.last
	return nil
}

// simPromptTokens is the simulator's default prompt length: 1.3 tokens
// per word plus BOS, about what a 32k Llama vocabulary gives for English.
func simPromptTokens(s string) int { return 1 + int(math.Ceil(1.3*float64(len(strings.Fields(s))))) }

// Outcome is what happened to one benchmark request.
type Outcome struct {
	Req      WorkRequest
	Result   sched.Result
	Response time.Duration // arrival to finish
}

// Run is one benchmark run's outcomes and the scheduler's overhead.
type Run struct {
	Policy    string
	Outcomes  []Outcome
	Makespan  time.Duration // first arrival to last finish
	SchedWall time.Duration // the scheduler's own wall time
	// IntakeWall is the part of SchedWall outside the lanes' sections
	// (scoring and queueing, once per request).
	IntakeWall time.Duration
	Engine     time.Duration // engine time: simulated, or Engine.Step wall time
	Steps      uint64        // engine steps, all lanes
	// Arrival and Drain are what the lanes decoded from the first arrival
	// to the last, and from the last arrival to the last finish (zero
	// where a phase has no length), with the mean context of those tokens:
	// a phase of long answers decodes slower on the same lanes.
	Arrival, Drain Decoded
	// SubmitLag is how late the real-engine clients submitted requests
	// after their arrival times: the 99th percentile and the worst. Where
	// the clients share the CPUs with busy lanes they fall behind and
	// submit in bursts, which the workload did not ask for.
	SubmitLagP99, SubmitLagMax time.Duration
	// PromptTokens are the run's prompt tokens, and ReusedTokens those the
	// real engine's lanes took from freed sequences' KV rows instead of
	// prefilling them (prefix reuse; zero in the simulator).
	PromptTokens, ReusedTokens int
}

// SimConfig configures Simulate.
type SimConfig struct {
	Sched     sched.Config
	Estimator *sched.Estimator
	Lanes     []StepCosts
	// PromptTokens counts a prompt's tokens (default simPromptTokens).
	PromptTokens func(string) int
}

// Simulate runs the real scheduler on simulated engines in simulated
// time: a discrete-event loop over arrivals and step ends. Each step
// lasts its measured cost plus the wall time the scheduler itself spent
// planning it, delivering the previous one and taking arrivals, so the
// scheduler's overhead slows the simulated system exactly as much as it
// would slow the real one.
func Simulate(reqs []WorkRequest, cfg SimConfig) (Run, error) {
	if len(cfg.Lanes) == 0 {
		return Run{}, fmt.Errorf("sim: no lanes")
	}
	count := cfg.PromptTokens
	if count == nil {
		count = simPromptTokens
	}
	natural := map[string]int{}
	for _, r := range reqs {
		natural[r.ID] = r.Natural
	}
	base := time.Unix(1_700_000_000, 0)
	var clock time.Duration
	sc := cfg.Sched
	sc.Manual = true
	sc.Now = func() time.Time { return base.Add(clock) }
	engines := make([]*simEngine, len(cfg.Lanes))
	lanes := make([]sched.Lane, len(cfg.Lanes))
	for i, c := range cfg.Lanes {
		engines[i] = newSimEngine(c, natural)
		lanes[i] = sched.Lane{Name: c.Name, Engine: engines[i]}
	}
	s, err := sched.New(sc, cfg.Estimator, lanes...)
	if err != nil {
		return Run{}, err
	}
	for i, c := range cfg.Lanes {
		s.SeedCost(i, c.A, c.B, c.C)
	}

	type laneState struct {
		step *sched.Step
		end  time.Duration
	}
	ls := make([]laneState, len(lanes))
	var owed time.Duration // scheduler time not yet charged to a step
	start := func(i int) {
		w := time.Now()
		st := s.Begin(i)
		if st == nil {
			owed += time.Since(w)
			return
		}
		engines[i].last = 0
		st.Run(context.Background())
		// Run's own cost is the engine's (simulated); the rest of the
		// wall time is the scheduler's.
		over := time.Since(w) - st.EngineWall() + owed
		owed = 0
		ls[i] = laneState{step: st, end: clock + engines[i].last + over}
	}
	streams := make([]*sched.Stream, len(reqs))
	next := 0
	var atLastArrival sched.Stats // what was decoded by the last arrival
	for {
		lane := -1
		for i := range ls {
			if ls[i].step != nil && (lane < 0 || ls[i].end < ls[lane].end) {
				lane = i
			}
		}
		switch {
		case next < len(reqs) && (lane < 0 || reqs[next].Arrival <= ls[lane].end):
			r := reqs[next]
			clock = max(clock, r.Arrival)
			n := count(r.Prompt)
			ids := make([]int32, n)
			for k := range ids {
				ids[k] = int32(3 + k%90)
			}
			w := time.Now()
			st, err := s.Submit(context.Background(), sched.Request{ID: r.ID, Prompt: ids, Text: r.Prompt,
				MaxTokens: r.MaxTokens, MinTokens: r.MinTokens, Deadline: r.Deadline,
				Utility: sched.Utility{Value: r.Utility}, StopTokens: []int32{simEOS}})
			owed += time.Since(w)
			if err != nil {
				return Run{}, fmt.Errorf("sim: submit %s: %w", r.ID, err)
			}
			streams[next] = st
			next++
			if next == len(reqs) {
				atLastArrival = s.Stats()
			}
		case lane >= 0:
			clock = ls[lane].end
			st := ls[lane].step
			ls[lane].step = nil
			w := time.Now()
			s.End(st)
			owed += time.Since(w)
		default:
			// Every lane is idle and nothing is left to arrive: a request
			// still unanswered would wait for good.
			for i, st := range streams {
				if st.Result() == nil {
					return Run{}, fmt.Errorf("sim: request %s never finished: every lane is idle and it still waits (%d waiting in all)", reqs[i].ID, s.Stats().Waiting)
				}
			}
			return simCollect(s, reqs, streams, engines, atLastArrival), nil
		}
		for i := range ls {
			if ls[i].step == nil {
				start(i)
			}
		}
	}
}

// laneSteps is the engine steps all of a scheduler's lanes have run.
func laneSteps(st sched.Stats) uint64 {
	var n uint64
	for _, l := range st.Lanes {
		n += l.Steps
	}
	return n
}

// simCollect gathers the streams' results and the simulated engine time.
func simCollect(s *sched.Scheduler, reqs []WorkRequest, streams []*sched.Stream, engines []*simEngine, atLastArrival sched.Stats) Run {
	run := Run{Policy: s.Policy().String()}
	for i, st := range streams {
		res := st.Result()
		run.Outcomes = append(run.Outcomes, Outcome{Req: reqs[i], Result: *res, Response: res.Finish.Sub(res.Arrival)})
	}
	st := s.Stats()
	run.phases(sched.Stats{}, atLastArrival, st)
	run.SchedWall, run.IntakeWall = st.SchedulerWall, st.IntakeWall
	run.Steps = laneSteps(st)
	for _, e := range engines {
		run.Engine += e.busy
	}
	return run
}
