// Command example is a robot planner on tandem's runtime, the way a Go
// program on a Jetson links it: it asks the model for a plan with a
// deadline per step, receives the plan one step (segment) at a time,
// "executes" each step while the sequence stays parked with its KV cache,
// resumes it for the next step with a fresh deadline, and prints the
// timings and the scheduler's statistics.
//
//	go run ./jetson/example
//	go run ./jetson/example --model stories260K.gguf --goal "Tom wanted to fly a kite." --steps 4
//	go run ./jetson/example --cpus 0-1 --threads 2   # the lane on CPUs 0-1, the rest left to control loops
//
// With no --model it runs the embedded default model, so it needs no
// files (that model's text is not a sensible plan, but the scheduling is
// the same). A step ends at a newline, or after --max-step-chars
// characters without one, so a model that never ends a line still
// releases steps.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "example:", err)
		}
		os.Exit(2)
	}
}

// options are the command line.
type options struct {
	model, tokenizer, goal string
	cpus                   cpuset.Set
	steps, threads         int
	maxTokens, maxChars    int
	deadline, execute      time.Duration
	temperature            float64
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./jetson/example [flags]\n\nA robot planner: the plan arrives one step (line) at a time, each step\nunder its own deadline; the sequence waits parked while the step executes.\n\nflags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.model, "model", "", "model file (default: the embedded model)")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "tokenizer.bin or GGUF vocabulary (default: the model's own)")
	fs.StringVar(&o.goal, "goal", "Plan: pick up the red cup and put it on the shelf. Steps, one per line:\n", "the planning prompt")
	fs.IntVar(&o.steps, "steps", 4, "plan steps to execute (the plan may end earlier)")
	fs.IntVar(&o.threads, "threads", 2, "kernel threads of the planner's lane")
	cpus := fs.String("cpus", "", "pin the planner's lane to these CPUs (a list such as 0-1, or big or little on a phone), leaving the others to the robot's control loops (default: the OS places it)")
	fs.IntVar(&o.maxTokens, "max-tokens", 256, "tokens for the whole plan")
	fs.IntVar(&o.maxChars, "max-step-chars", 120, "a step without a newline ends after this many characters")
	fs.DurationVar(&o.deadline, "deadline", 500*time.Millisecond, "deadline of each step, from submit or resume")
	fs.DurationVar(&o.execute, "execute", 200*time.Millisecond, "how long executing a step takes (simulated)")
	fs.Float64Var(&o.temperature, "temperature", 0, "sampling temperature (0: greedy, a repeatable plan)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q; see --help", fs.Arg(0))
	case o.steps < 1 || o.threads < 1 || o.maxTokens < 1 || o.maxChars < 1:
		return o, errors.New("--steps, --threads, --max-tokens and --max-step-chars must be at least 1")
	case o.deadline <= 0 || o.execute < 0:
		return o, errors.New("--deadline must be positive and --execute not negative")
	}
	if *cpus != "" {
		var err error
		if o.cpus, err = cpuset.Named(*cpus); err != nil {
			return o, fmt.Errorf("--cpus: %w", err)
		}
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	f, tok, err := open(o.model, o.tokenizer)
	if err != nil {
		return err
	}
	defer f.Close()
	lanes, closeLanes, err := sched.LoadLanes(f, sched.LaneOptions{Lanes: []sched.LaneSpec{{Threads: o.threads, CPUs: o.cpus}}, MaxSeqs: 4})
	if err != nil {
		return err
	}
	defer closeLanes()
	est, err := estimator(o.model)
	if err != nil {
		return err
	}
	sc, err := sched.New(sched.Config{}, est, lanes...)
	if err != nil {
		return err
	}
	defer sc.Shutdown(context.Background())

	// One step per line, or per max-step-chars characters of a line.
	seg, err := sched.NewRegexSegmenter(fmt.Sprintf(`[^\n]*\n|[^\n]{%d}`, o.maxChars))
	if err != nil {
		return err
	}
	req := sched.Request{ID: "plan", MaxTokens: o.maxTokens, Deadline: o.deadline, Segment: seg,
		Sampling: sample.Options{Temperature: float32(o.temperature), Seed: 1}}
	if err := req.SetTextPrompt(tok, o.goal); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "planner: %s, %d thread(s), step deadline %v, execution %v per step\n", f.Path, o.threads, o.deadline, o.execute)

	start := time.Now()
	st, err := sc.Submit(ctx, req)
	if err != nil {
		return err
	}
	var planning, executing time.Duration
	for step := 1; ; step++ {
		text, res, err := receive(ctx, st)
		if err != nil {
			return err
		}
		planning += res.Finish.Sub(res.Arrival)
		met := "no deadline"
		if res.HasDeadline {
			met = map[bool]string{true: "deadline met", false: "deadline MISSED"}[res.DeadlineMet]
		}
		first := time.Duration(0)
		if !res.FirstToken.IsZero() {
			first = res.FirstToken.Sub(res.Arrival)
		}
		fmt.Fprintf(stdout, "step %d: %q\n  planned in %v (first token %v, %d tokens), %s\n",
			step, strings.TrimSpace(text), res.Finish.Sub(res.Arrival).Round(time.Microsecond), first.Round(time.Microsecond), res.CompletionTokens, met)
		if res.Reason != sched.ReasonSegment {
			fmt.Fprintf(stdout, "plan ended: %s after %d tokens\n", res.Reason, res.TotalGenerated)
			break
		}
		t0 := time.Now()
		fmt.Fprintf(stdout, "  executing step %d ...", step)
		select {
		case <-time.After(o.execute):
		case <-ctx.Done():
			return ctx.Err()
		}
		executing += time.Since(t0)
		fmt.Fprintf(stdout, " done in %v\n", time.Since(t0).Round(time.Microsecond))
		if step == o.steps {
			// Done with the plan: free the parked sequence's KV cache.
			if err := sc.Discard("plan"); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "plan stopped after %d steps\n", step)
			break
		}
		if st, err = sc.Resume(ctx, "plan", sched.ResumeOptions{Deadline: o.deadline}); err != nil {
			return err
		}
	}
	s := sc.Stats()
	fmt.Fprintf(stdout, "total %v: planning %v, executing %v\n", time.Since(start).Round(time.Millisecond),
		planning.Round(time.Microsecond), executing.Round(time.Microsecond))
	fmt.Fprintf(stdout, "scheduler: %d admitted, %d segments, %d completed, deadlines %d met / %d missed, %d tokens, %d evicted, engine %v, scheduler %v\n",
		s.Admitted, s.Segment, s.Completed, s.DeadlineHits, s.DeadlineMisses, s.Tokens, s.Evicted,
		s.EngineWall.Round(time.Microsecond), s.SchedulerWall.Round(time.Microsecond))
	for _, l := range s.Lanes {
		fmt.Fprintf(stdout, "lane %s: %d threads%s, %d steps, step time %v, %d sequences held (%d KiB KV)\n",
			l.Name, l.Threads, l.CPUs.Where(), l.Steps, l.StepTime.Round(time.Microsecond), l.Sequences, l.KVBytes>>10)
	}
	return nil
}

// receive reads one stream (one step) to its end.
func receive(ctx context.Context, st *sched.Stream) (string, *sched.Result, error) {
	var b strings.Builder
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			return "", nil, err
		}
		b.WriteString(ev.Text)
		if ev.Done {
			if ev.Result.Reason == sched.ReasonError {
				return "", nil, ev.Result.Err
			}
			return b.String(), ev.Result, nil
		}
	}
}

// estimator is the embedded model's uncertainty calibration, or the one
// tandem calibrate wrote beside the model (the prompt length without).
func estimator(modelPath string) (*sched.Estimator, error) {
	if modelPath == "" {
		c, err := sched.ParseCalibration(defaultmodel.Calibration(), defaultmodel.CalibrationName)
		if err != nil {
			return nil, err
		}
		return sched.NewEstimator(c), nil
	}
	c, err := sched.LoadCalibration(sched.CalibrationPath(modelPath))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return sched.NewEstimator(nil), nil
	case err != nil:
		return nil, err
	}
	return sched.NewEstimator(c), nil
}

// open loads the model (or the embedded one) and its tokenizer.
func open(modelPath, tokPath string) (*weights.File, *tokenizer.Tokenizer, error) {
	var f *weights.File
	var err error
	if modelPath == "" {
		f, err = defaultmodel.Target()
	} else {
		f, err = weights.Open(modelPath)
	}
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.ForModel(f, tokPath)
	if err != nil {
		f.Close()
		switch {
		case errors.Is(err, tokenizer.ErrNoVocabulary):
			err = fmt.Errorf("%v: pass --tokenizer", err)
		case errors.Is(err, tokenizer.ErrWrongVocabulary):
			err = fmt.Errorf("%v: pass the model's own with --tokenizer", err)
		}
		return nil, nil, err
	}
	return f, tok, nil
}
