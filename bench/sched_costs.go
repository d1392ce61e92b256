package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/weights"
)

// CostConfig configures MeasureStepCosts.
type CostConfig struct {
	Threads int
	Device  string // where the model computes: "" (the CPU) or "cuda[:N]" (a build with -tags cuda)
	Batches []int  // decode batch sizes to time (default 1, 2, 4, 8)
	Reps    int    // timed steps per batch size (default 5; the fastest counts)
	Context int    // KV context per sequence (default 512)
	// LongContext, when above the short context the batches are timed
	// at, times full batches again with about this much context each and
	// sets StepCosts.D from the difference (0: D stays 0).
	LongContext int
	// CPUs pins the timed lane's threads, as sched.LaneSpec.CPUs does.
	CPUs cpuset.Set
}

// MeasureStepCosts times the plain engine on the model in f: prefill
// steps of a 64-token chunk and decode steps at each batch size, and fits
// the step model A + B·members + C·prefill tokens the simulator uses.
func MeasureStepCosts(f *weights.File, cfg CostConfig) (StepCosts, error) {
	if len(cfg.Batches) == 0 {
		cfg.Batches = []int{1, 2, 4, 8}
	}
	if cfg.Reps <= 0 {
		cfg.Reps = 5
	}
	if cfg.Context <= 0 {
		cfg.Context = 512
	}
	if cfg.CPUs != nil {
		// A pinned lane's goroutine is pinned too, and so is its timing.
		var c StepCosts
		err := cpuset.Run(cfg.CPUs, func() error {
			var err error
			c, err = measureStepCosts(f, cfg)
			return err
		})
		return c, err
	}
	return measureStepCosts(f, cfg)
}

func measureStepCosts(f *weights.File, cfg CostConfig) (StepCosts, error) {
	m, err := model.Load(f, model.Options{Threads: cfg.Threads, Device: cfg.Device, CPUs: cfg.CPUs})
	if err != nil {
		return StepCosts{}, err
	}
	defer m.Close()
	e, err := sched.NewModelEngine(m, sched.ModelEngineOptions{MaxSeqs: slices.Max(cfg.Batches), Context: min(cfg.Context, m.Config().Context), PrefillChunk: costChunk,
		NoPrefixReuse: true})
	if err != nil {
		return StepCosts{}, err
	}
	cfg.LongContext = min(cfg.LongContext, e.Info().Context-cfg.Reps-1)
	c, err := timeStepCosts(e, m.Config().Vocab, cfg)
	c.Context = m.Config().Context
	return c, err
}

// costChunk is the prompt MeasureStepCosts prefills per sequence, one
// chunk.
const costChunk = 64

// timeStepCosts times e's steps for MeasureStepCosts and fits the step
// model. Each batch size counts its fastest of cfg.Reps steps, and the
// prefill its fastest chunk: a shared machine's slow spells and a cold
// start only ever add time, and on stories260K medians of five put the
// cost per member anywhere from 25 to 78 µs between calls where the
// fastest steps gave 31-38.
func timeStepCosts(e sched.Engine, vocab int, cfg CostConfig) (StepCosts, error) {
	prompt := fillerPrompt(costChunk, vocab)
	ctx := context.Background()
	maxB := slices.Max(cfg.Batches)
	var members []sched.Member
	var prefills []time.Duration
	for range maxB {
		id, err := e.Start(prompt, nil, "")
		if err != nil {
			return StepCosts{}, err
		}
		mb := []sched.Member{{Seq: id, Limit: 1}}
		t0 := time.Now()
		if err := e.Step(ctx, mb, make([]sched.StepOut, 1)); err != nil {
			return StepCosts{}, err
		}
		prefills = append(prefills, time.Since(t0))
		members = append(members, mb[0])
	}
	out := make([]sched.StepOut, maxB)
	// attended[i] is the context member i's next decode follows.
	attended := make([]int, maxB)
	for i := range attended {
		attended[i] = costChunk
	}
	var xs []float64
	var ys []float64
	var full time.Duration // the fastest step of the largest batch
	var fullContext float64
	for _, n := range cfg.Batches {
		var d []time.Duration
		var sum int
		for range cfg.Reps {
			t0 := time.Now()
			if err := e.Step(ctx, members[:n], out[:n]); err != nil {
				return StepCosts{}, err
			}
			d = append(d, time.Since(t0))
			for i := range n {
				sum += attended[i]
				attended[i]++
			}
		}
		xs = append(xs, float64(n))
		ys = append(ys, slices.Min(d).Seconds())
		if n == maxB {
			full, fullContext = slices.Min(d), float64(sum)/float64(n*cfg.Reps)
		}
	}
	a, b := schedLineFit(xs, ys)
	if b <= 0 {
		return StepCosts{}, fmt.Errorf("bench: decode step time does not grow with the batch (%v s at %v); the measurement is too noisy, retry on a quieter machine", ys, xs)
	}
	a = max(a, 0)
	c := max((slices.Min(prefills).Seconds()-a-b)/costChunk, 0)
	sec := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	costs := StepCosts{A: sec(a), B: sec(b), C: sec(c), MaxSeqs: 16}
	if float64(cfg.LongContext) <= fullContext+1 {
		return costs, nil
	}
	long, longContext, err := timeLongContext(e, members, vocab, cfg)
	if err != nil {
		return StepCosts{}, err
	}
	// Per member, per token of context; no more than leaves a member at
	// no context a cost of its own.
	d := (long - full).Seconds() / (float64(maxB) * (longContext - fullContext))
	costs.D = sec(min(max(d, 0), b/fullContext))
	costs.BAt = int(math.Round(fullContext))
	return costs, nil
}

// timeLongContext replaces members' sequences with ones whose prompts
// fill about cfg.LongContext tokens and returns the fastest of cfg.Reps
// full-batch decode steps over them and the mean context they followed.
func timeLongContext(e sched.Engine, members []sched.Member, vocab int, cfg CostConfig) (time.Duration, float64, error) {
	ctx := context.Background()
	prompt := fillerPrompt(cfg.LongContext-cfg.Reps, vocab)
	for i := range members {
		if err := e.Free(members[i].Seq); err != nil {
			return 0, 0, err
		}
		id, err := e.Start(prompt, nil, "")
		if err != nil {
			return 0, 0, err
		}
		members[i] = sched.Member{Seq: id, Limit: 1}
	}
	out := make([]sched.StepOut, len(members))
	// Prefill in chunks until every member has yielded its first token. A
	// member that has stops stepping: decoding on while the others
	// prefilled, the first ones outgrew a 256-token context (the embedded
	// model's), and their contexts were longer than the cost assumes.
	prefilling := slices.Clone(members)
	for len(prefilling) > 0 {
		o := out[:len(prefilling)]
		if err := e.Step(ctx, prefilling, o); err != nil {
			return 0, 0, err
		}
		left := prefilling[:0]
		for j, m := range prefilling {
			if o[j].Err != nil {
				return 0, 0, o[j].Err
			}
			if len(o[j].Tokens) == 0 {
				left = append(left, m)
			}
		}
		prefilling = left
	}
	var d []time.Duration
	for range cfg.Reps {
		t0 := time.Now()
		if err := e.Step(ctx, members, out); err != nil {
			return 0, 0, err
		}
		d = append(d, time.Since(t0))
	}
	// The decodes followed len(prompt) to len(prompt)+Reps-1 tokens.
	return slices.Min(d), float64(len(prompt)) + float64(cfg.Reps-1)/2, nil
}

// fillerPrompt is n tokens cycling through the vocabulary past token 0:
// timing needs a context's length, not its sense.
func fillerPrompt(n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(1 + i%(vocab-1))
	}
	return p
}

// schedLineFit is the least-squares line y = a + b·x.
func schedLineFit(xs, ys []float64) (a, b float64) {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	n := float64(len(xs))
	mx, my = mx/n, my/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return my, 0
	}
	b = sxy / sxx
	return my - b*mx, b
}
