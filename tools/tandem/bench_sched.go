package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

func runBenchSched(args []string, stdout, stderr io.Writer) (retErr error) {
	fs := newFlags("bench sched", "[--model FILE] [--sim-shape NAME] [flags]",
		"Benchmarks the request scheduler: Poisson arrivals stepping from light load\n"+
			"to overload, a mix of planners (short, tight deadlines), chats, background\n"+
			"summaries (min_tokens) and a share of adversarial long-output prompts,\n"+
			"under the policies FIFO, least-uncertainty-first (luf),\n"+
			"earliest-deadline-first (edf), RT-LM as published (rtlm, raw counts) and\n"+
			"tandem's. It runs the real engine on --model (--lanes: CPU lanes of so many\n"+
			"threads, or a GPU lane, cuda, in a build with -tags cuda), and the same\n"+
			"scheduler in a discrete-event simulator whose per-step costs are measured\n"+
			"on a synthetic model of --sim-shape (or given by --sim-costs); the\n"+
			"simulator charges the scheduler's own run time. Load 1.0 is the lanes'\n"+
			"token capacity at full batch (the simulator's step costs; for the real\n"+
			"engine, the fastest of three bursts drawn from the workload, probed again\n"+
			"after the runs, which are redone once when that reads over 10% higher)\n"+
			"divided by the mean request length (for the real engine, the mean answer\n"+
			"the model gives the workload, served once as a burst before the runs).\n"+
			"Each real-engine row is the median of --repeat runs, the policies taking\n"+
			"turns, since one run on a busy machine can be far off. The goal table\n"+
			"bounds every policy's p99 and slowest response (for the real engine at the\n"+
			"most the lanes decoded at any batch cap, with the model's own answers, and\n"+
			"again at the fastest rate a run decoded over its arrivals or its drain;\n"+
			"a token's cost grows with its context, so each rate is first converted to\n"+
			"the mean context of the answers the bound counts).\n"+
			"Prints markdown tables and writes sched.md, sched.json and sched.svg to --out.\n"+
			"With the defaults it takes about half an hour on two cores; --loads 1.6\n"+
			"--policies tandem,fifo --ablate=false gives the goal rows in a few minutes.", stdout, stderr,
		"tandem bench sched --model stories260K.gguf --out /tmp/sched",
		"tandem bench sched --real=false --sim-costs 300,30,5 --variance small,normal,large",
		"tandem bench sched --model stories260K.gguf --sim-shape '' --loads 0.5,1.5")
	modelPath := fs.String("model", "", "model for the real-engine runs (default: the embedded model)")
	tokPath := fs.String("tokenizer", "", "its tokenizer (default: the model's own)")
	real := fs.Bool("real", true, "run the real engine")
	simShape := fs.String("sim-shape", "tinyllama-1.1b", "shape whose step costs the simulator uses ('' skips the simulator)")
	simType := fs.String("sim-type", "q4_0", "weight type of the synthetic model")
	simCosts := fs.String("sim-costs", "", "simulator step costs in ms: A,B,C[,D] = per step, per decoding member, per prefill token, and per decoding member per token of its context (D: attention reading the KV cache; 0 when left out) (skips measuring); A,B,C/A,B,C/... gives each simulated lane its own, the first the primary (a GPU lane beside a CPU lane, say)")
	simThreads := fs.Int("sim-threads", 1, "threads per lane when measuring the simulator's costs (1 to 256)")
	policies := fs.String("policies", "tandem,fifo,luf,edf,rtlm", "policies to compare; tandem-shed, tandem-admit and tandem-route are tandem without that part")
	loads := fs.String("loads", "0.3,0.6,0.9,1.2,1.6", "offered loads (1.0: the measured capacity)")
	adversarial := fs.String("adversarial", "0,0.2,0.4", "shares of adversarial long-output prompts")
	variance := fs.String("variance", "normal", "output-length variance within a class: small, normal, large (the real engine uses the first)")
	// 600, as in the simulator: the p99 of fewer requests is set by one
	// or two of them (150 scattered from −19% to −38% against FIFO at 20%
	// adversarial in five runs, 600 from −33% to −39%).
	requests := fs.Int("requests", 600, "requests per real-engine run (10 to 100000)")
	repeat := fs.Int("repeat", 3, "real-engine runs per setting and policy; the rows are their medians")
	simRequests := fs.Int("sim-requests", 600, "requests per simulated run (10 to 100000)")
	lanesFlag := fs.String("lanes", "1,1", "the real engine's lanes, comma separated: threads per CPU lane, pinned to CPUs with @ (1@0,1@1; 4@big,4@little on a phone), or cuda / cuda:N for a GPU lane (a build with -tags cuda); the simulator uses as many lanes")
	maxBatch := fs.Int("max-batch", 8, "most sequences a lane decodes together")
	calib := fs.String("calibration", "", "estimator for the real engine (default: MODEL.calib.json, or the embedded model's own; calibrated now when missing)")
	ablate := fs.Bool("ablate", true, "add simulator rows for tandem without shedding, admission control and routing")
	prefixReuse := fs.Bool("prefix-reuse", true, "the real engine's lanes start a request from a finished one's KV cache where their prompts share a prefix, as tandem serve does (every policy alike; the step costs are measured without it)")
	outDir := fs.String("out", "", "directory for sched.md, sched.json and sched.svg")
	outcomes := fs.String("outcomes", "", "write every run's requests to FILE, one JSON line each (policy, setting, class, arrival, first token, response, tokens, shed, lane, score, deadline), to see who set a row's tail")
	seed := fs.Uint64("seed", 1, "workload seed")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	// Flags of a part the run skips: bad usage, as elsewhere.
	if !*real {
		if err := unusedFlags(fs, "sets the real engine's runs, and --real=false skips them",
			"model", "tokenizer", "calibration", "requests", "repeat", "prefix-reuse"); err != nil {
			return err
		}
	}
	if *simCosts != "" {
		if err := unusedFlags(fs, "sets how the simulator's costs are measured, and --sim-costs gives them",
			"sim-shape", "sim-type", "sim-threads"); err != nil {
			return err
		}
	}
	pols, err := parsePolicies(*policies)
	if err != nil {
		return err
	}
	loadList, err := parseFloats("--loads", *loads, 0.01, 100)
	if err != nil {
		return err
	}
	advList, err := parseFloats("--adversarial", *adversarial, 0, 1)
	if err != nil {
		return err
	}
	var vars []bench.Variance
	for _, v := range strings.Split(*variance, ",") {
		x, err := bench.ParseVariance(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%w: --variance: %v", errUsage, err)
		}
		vars = append(vars, x)
	}
	specs, err := parseLanes(*lanesFlag)
	if err != nil {
		return err
	}
	if *real {
		noteTurns(stderr, "bench sched", specs)
	}
	if *simThreads < 1 || *simThreads > kernels.MaxThreads {
		return fmt.Errorf("%w: --sim-threads %d: want 1 to %d", errUsage, *simThreads, kernels.MaxThreads)
	}
	if *requests < 10 || *simRequests < 10 || *maxBatch < 1 || *repeat < 1 {
		return fmt.Errorf("%w: --requests and --sim-requests must be at least 10, --max-batch and --repeat at least 1", errUsage)
	}
	// A million simulated requests took 3 GB and a minute; two billion ran
	// out of memory.
	if *requests > maxBenchRequests || *simRequests > maxBenchRequests {
		return fmt.Errorf("%w: --requests %d, --sim-requests %d: at most %d per run; use --repeat for more runs", errUsage, *requests, *simRequests, maxBenchRequests)
	}
	if *outDir != "" {
		// A folder made for this run goes if it fails or is interrupted.
		discard, err := reportDir("--out", *outDir)
		if err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				discard()
			}
		}()
		if err := checkWritable("--out", *outDir); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg := schedBench{policies: pols, loads: loadList, adversarial: advList, variances: vars, maxBatch: *maxBatch,
		repeat: *repeat, seed: *seed, noPrefixReuse: !*prefixReuse, stderr: stderr}
	if *outcomes != "" {
		// Checked before the runs, so a path that cannot be written fails
		// at once rather than after them. The lines go to a temporary
		// file beside it, renamed over it when every run is done: an
		// interrupted run left thousands of lines of an unfinished file.
		if err := checkOutput("--outcomes", *outcomes); err != nil {
			return err
		}
		f, err := interrupt.CreateOutput(*outcomes)
		if err != nil {
			return fmt.Errorf("--outcomes: %w", err)
		}
		w := bufio.NewWriter(f)
		cfg.outcomes = w
		defer func() {
			if retErr != nil {
				f.Discard()
				return
			}
			err := w.Flush()
			if err == nil {
				err = f.Commit()
			}
			if err != nil {
				f.Discard()
				retErr = fmt.Errorf("--outcomes: %w", err)
			}
		}()
	}

	var rows []bench.SchedRow
	var notes []string
	if *real {
		r, note, err := cfg.real(ctx, *modelPath, *tokPath, *calib, specs, *requests)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
		notes = append(notes, note)
	}
	if *simShape != "" || *simCosts != "" {
		costs, note, err := simStepCosts(*simShape, *simType, *simCosts, *simThreads, stderr)
		if err != nil {
			return err
		}
		if len(costs) == 1 {
			costs = slices.Repeat(costs, len(specs))
		}
		r, err := cfg.sim(ctx, costs, *simRequests, *ablate)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
		notes = append(notes, note)
	}
	if len(rows) == 0 {
		return fmt.Errorf("%w: nothing to run: --real=false and no simulator shape or costs", errUsage)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "Scheduler benchmark (tandem bench sched %s)\n\n", shellLine(args))
	for _, n := range notes {
		fmt.Fprintf(&md, "- %s\n", n)
	}
	md.WriteString("\n" + bench.SchedTable(rows))
	if goals := bench.Goals(rows); len(goals) > 0 {
		md.WriteString("\nAt the highest load, tandem against FIFO:\n\n" + bench.GoalTable(goals))
	} else {
		md.WriteString("\nNo goal table: it compares tandem with FIFO, and --policies runs " + *policies + ".\n")
	}
	fmt.Fprint(stdout, md.String())
	if *outDir != "" {
		data, _ := json.MarshalIndent(rows, "", "  ")
		for name, content := range map[string][]byte{"sched.md": []byte(md.String()), "sched.json": data, "sched.svg": []byte(bench.SchedSVG(rows))} {
			if err := os.WriteFile(filepath.Join(*outDir, name), content, 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(stderr, "wrote sched.md, sched.json and sched.svg to %s\n", *outDir)
	}
	return nil
}

type schedBench struct {
	policies    []policyVariant
	loads       []float64
	adversarial []float64
	variances   []bench.Variance
	maxBatch    int
	repeat      int // real-engine runs per setting and policy
	seed        uint64
	// noPrefixReuse turns off the real engine's prefix reuse.
	noPrefixReuse bool
	stderr        io.Writer
	outcomes      io.Writer // --outcomes: every run's requests, or nil
}

// writeOutcomes writes run's requests to --outcomes, if set.
func (b schedBench) writeOutcomes(row bench.SchedRow, index int, run bench.Run) error {
	if b.outcomes == nil {
		return nil
	}
	if err := bench.WriteRecords(b.outcomes, bench.Records(row, index, run)); err != nil {
		return fmt.Errorf("--outcomes: %w", err)
	}
	return nil
}

// policyVariant is a policy, possibly with parts of tandem switched off.
type policyVariant struct {
	name   string
	policy sched.Policy
	ablate sched.Ablation
}

// ablations are tandem with one part switched off: the simulator adds
// them with --ablate, and --policies takes them by name (tandem-shed,
// tandem-admit, tandem-route) to run them on the real engine.
var ablations = []policyVariant{
	{"tandem -shed", sched.Tandem, sched.Ablation{NoShedding: true}},
	{"tandem -admit", sched.Tandem, sched.Ablation{NoAdmission: true}},
	{"tandem -route", sched.Tandem, sched.Ablation{NoRouting: true}},
}

// maxBenchRequests bounds the requests of one benchmark run.
const maxBenchRequests = 100_000

func parsePolicies(s string) ([]policyVariant, error) {
	var out []policyVariant
	add := func(v policyVariant) error {
		for _, o := range out {
			if o.name == v.name {
				return fmt.Errorf("%w: --policies names %s twice: each policy runs once a setting", errUsage, v.name)
			}
		}
		out = append(out, v)
		return nil
	}
next:
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		for _, a := range ablations {
			if strings.EqualFold(p, strings.ReplaceAll(a.name, " -", "-")) {
				if err := add(a); err != nil {
					return nil, err
				}
				continue next
			}
		}
		pol, err := sched.ParsePolicy(p)
		if err != nil {
			return nil, fmt.Errorf("%w: --policies: %v, or tandem-shed, tandem-admit, tandem-route (tandem without that part)", errUsage, err)
		}
		if err := add(policyVariant{name: pol.String(), policy: pol}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func parseFloats(flag, s string, lo, hi float64) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(x >= lo && x <= hi) { // NaN fails too
			return nil, fmt.Errorf("%w: %s %q: want numbers in %g..%g separated by commas", errUsage, flag, s, lo, hi)
		}
		out = append(out, x)
	}
	return out, nil
}

// meanTokens is the mean output length a workload asks for (what the
// simulator generates; the real model may stop some earlier).
func meanTokens(reqs []bench.WorkRequest) float64 {
	var s float64
	for _, r := range reqs {
		s += float64(min(r.Natural, r.MaxTokens))
	}
	return s / float64(len(reqs))
}

// rate turns an offered load into arrivals per second: load × token
// capacity (every lane at full batch) ÷ mean request length.
func (b schedBench) rate(load float64, lanes []bench.StepCosts, adv float64, v bench.Variance, tokTime time.Duration) float64 {
	sample := bench.Workload(bench.WorkloadConfig{Requests: 2000, Adversarial: adv, Variance: v, TokenTime: tokTime, Seed: b.seed + 99})
	// Lanes whose members cost more the longer their context decode the
	// whole answers (nothing shed) at their mean context.
	whole := slices.Clone(sample)
	for i := range whole {
		whole[i].MinTokens = 0
	}
	meanCtx := bench.MeanContext(whole, nil)
	var capacity float64
	for _, c := range lanes {
		capacity += c.AtContext(meanCtx).Capacity(b.maxBatch)
	}
	return load * capacity / meanTokens(sample)
}

func (b schedBench) real(ctx context.Context, modelPath, tokPath, calib string, specs []sched.LaneSpec, n int) ([]bench.SchedRow, string, error) {
	f, err := openModel(modelPath)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	tok, err := loadTokenizer(f, tokPath, b.stderr)
	if err != nil {
		return nil, "", err
	}
	est, calPath, err := loadEstimator(calib, modelPath)
	if err != nil {
		return nil, "", err
	}
	// Each lane's costs first: a lane this build or machine cannot run
	// fails before the calibration's minutes.
	costs, err := laneStepCosts(f, specs, b.maxBatch, b.stderr)
	if err != nil {
		return nil, "", err
	}
	if calPath == "" {
		// Calibrated in memory only: a benchmark writes nothing beside
		// the model (run tandem calibrate to keep one).
		fmt.Fprintln(b.stderr, "no calibration for this model: calibrating in memory (tandem calibrate saves one)")
		cal, err := calibrate(ctx, f, tok, bench.CalibrationPrompts(300, bench.VarianceNormal, 448, b.seed+1000),
			calibrateOptions{lanes: calibrationLanes(specs), temperature: 0.8, seed: b.seed, epochs: 1500, maxTokens: 448, modelPath: modelPath}, b.stderr)
		if err != nil {
			return nil, "", err
		}
		est = sched.NewEstimator(cal)
		calPath = fmt.Sprintf("calibrated now (validation MAE %.1f tokens, fallback %.1f)", cal.Validation.MAE, cal.Validation.FallbackMAE)
	}
	ctxLen := min(512, costs[0].Context)
	lanes, closeLanes, err := sched.LoadLanes(f, sched.LaneOptions{Lanes: specs, MaxSeqs: 16, Context: ctxLen, KVType: weights.F32,
		NoPrefixReuse: b.noPrefixReuse})
	if err != nil {
		return nil, "", err
	}
	defer closeLanes()
	encode := func(s string) ([]int32, error) { return tok.Encode(s, tokenizer.EncodeOptions{AddBOS: true}) }
	// probe measures on a FIFO scheduler over the lanes, shut down before
	// anything else runs on them (a scheduler holds its engines until its
	// Shutdown has freed their last sequences).
	probeOn := func(on []sched.Lane, maxBatch int, measure func(*sched.Scheduler) error) error {
		s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxBatch: maxBatch, MaxQueue: max(1024, n+1)}, est, on...)
		if err != nil {
			return err
		}
		return errors.Join(measure(s), s.Shutdown(context.Background()))
	}
	probe := func(measure func(*sched.Scheduler) error) error { return probeOn(lanes, b.maxBatch, measure) }
	var lengthLanes []sched.Lane
	for _, i := range fastLanes(costs, b.maxBatch) {
		lengthLanes = append(lengthLanes, lanes[i])
	}
	ids, _ := encode("Once upon a time")
	var tokTime time.Duration
	if err := probe(func(s *sched.Scheduler) (err error) {
		tokTime, err = bench.LiveTokenTime(ctx, s, ids)
		return err
	}); err != nil {
		return nil, "", err
	}
	stops := stopTokens(tok)
	// asRequests turns workload requests into bursts: no arrival times,
	// deadlines or scores, only what sets their work.
	asRequests := func(work []bench.WorkRequest) ([]sched.Request, error) {
		out := make([]sched.Request, len(work))
		for i, r := range work {
			p, err := encode(r.Prompt)
			if err != nil {
				return nil, err
			}
			out[i] = sched.Request{Prompt: p, MaxTokens: r.MaxTokens, StopTokens: stops}
		}
		return out, nil
	}
	// runPolicy runs reqs under p on a fresh scheduler over the lanes.
	runPolicy := func(p policyVariant, reqs []bench.WorkRequest) (bench.Run, error) {
		s, err := sched.New(sched.Config{Policy: p.policy, Ablate: p.ablate, MaxBatch: b.maxBatch, MaxQueue: n + 1}, est, lanes...)
		if err != nil {
			return bench.Run{}, err
		}
		defer s.Shutdown(context.Background())
		for i, c := range costs {
			s.SeedCost(i, c.A, c.B, c.C)
		}
		return bench.RunLive(ctx, s, reqs, encode, stops)
	}
	name := "real " + strings.TrimSuffix(filepath.Base(f.Path), filepath.Ext(f.Path))
	v := b.variances[0]
	total := len(b.adversarial) * len(b.loads) * len(b.policies) * b.repeat
	bar := progress.NewCount(b.stderr, "real-engine runs", uint64(total), "runs")
	defer bar.Done()
	var rows []bench.SchedRow
	var capacities []string
	done := uint64(0)
	for _, adv := range b.adversarial {
		// The capacity of this workload (its prompts, its answer lengths
		// and so its context lengths), every lane at full batch: load 1.0.
		sample := bench.Workload(bench.WorkloadConfig{Requests: 8 * len(lanes) * b.maxBatch, Adversarial: adv, Variance: v,
			TokenTime: tokTime, MaxTokens: ctxLen - 64, Seed: b.seed + 7})
		burst, err := asRequests(sample)
		if err != nil {
			return nil, "", err
		}
		probeCapacity := func() (d bench.Decoded, err error) {
			err = probe(func(s *sched.Scheduler) (err error) {
				d, err = bench.LiveCapacity(ctx, s, burst, 3)
				return err
			})
			return d, err
		}
		// Where the model ends this workload's answers sets the work it
		// offers: the arrival rates come from their mean length.
		work := bench.Workload(bench.WorkloadConfig{Requests: n, Rate: 1, Adversarial: adv, Variance: v,
			TokenTime: tokTime, MaxTokens: ctxLen - 64, Seed: b.seed})
		whole, err := asRequests(work)
		if err != nil {
			return nil, "", err
		}
		var answerLen float64
		if err := probeOn(lengthLanes, b.maxBatch, func(s *sched.Scheduler) (err error) {
			answerLen, err = bench.LiveMeanTokens(ctx, s, whole)
			return err
		}); err != nil {
			return nil, "", err
		}
		var shareRows []bench.SchedRow
		// Each load's workload and runs, kept for its floors.
		type loadRuns struct {
			reqs []bench.WorkRequest
			rows []int       // its rows in shareRows, one per policy
			runs []bench.Run // by repeat, then policy, as they ran
		}
		var byLoad []loadRuns
		runShare := func(capacity float64) error {
			shareRows, byLoad = shareRows[:0], byLoad[:0]
			for _, load := range b.loads {
				rate := load * capacity / answerLen
				reqs := bench.Workload(bench.WorkloadConfig{Requests: n, Rate: rate, Adversarial: adv, Variance: v,
					TokenTime: tokTime, MaxTokens: ctxLen - 64, Seed: b.seed})
				// Policies take turns, so a slow spell of the machine
				// falls on all of them rather than on one policy's runs.
				runs := make([][]bench.SchedRow, len(b.policies))
				lr := loadRuns{reqs: reqs}
				for range b.repeat {
					for i, p := range b.policies {
						run, err := runPolicy(p, reqs)
						if err != nil {
							return err
						}
						lr.runs = append(lr.runs, run)
						row := bench.Summarize(run)
						row.Engine, row.Policy, row.Load, row.Rate, row.Adversarial, row.Variance = name, p.name, load, rate, adv, v.String()
						runs[i] = append(runs[i], row)
						done++
						bar.Set(done)
					}
				}
				for _, r := range runs {
					lr.rows = append(lr.rows, len(shareRows))
					shareRows = append(shareRows, bench.MedianRow(r))
				}
				byLoad = append(byLoad, lr)
			}
			return nil
		}
		rounds := 0
		c, err := bench.AtCapacity(probeCapacity, func(capacity float64) error {
			if rounds++; rounds > 1 { // the runs again, from a higher capacity
				total += len(b.loads) * len(b.policies) * b.repeat
				bar.SetTotal(uint64(total))
			}
			return runShare(capacity)
		})
		if err != nil {
			return nil, "", err
		}
		// The floors at the most the lanes decoded at any batch cap, for
		// the answers the model gave. A probe's burst is cut when its
		// queue runs dry, before the long answers' tails, so its tokens
		// follow shorter contexts than the workload's: its rates are
		// compared at one context (ref) and each load's floors convert
		// them to its answers' mean context.
		ref := float64(costs[0].BAt)
		full := max(c.Used.At(ref, costs, b.maxBatch), c.After.At(ref, costs, b.maxBatch))
		best, bestBatch, err := bench.FastestCapacity(full, b.maxBatch, func(mb int) (got float64, err error) {
			err = probeOn(lanes, mb, func(s *sched.Scheduler) error {
				d, err := bench.LiveThroughput(ctx, s, burst)
				got = d.At(ref, costs, b.maxBatch)
				return err
			})
			return got, err
		})
		if err != nil {
			return nil, "", err
		}
		var topLoad, topRate, topContext, topBest float64 // the goal's load, its runs' best rate, its answers' mean context and the probe's rate there
		for li, lr := range byLoad {
			work, err := bench.MeasuredWork(lr.reqs, lr.runs)
			if err != nil {
				return nil, "", err
			}
			// The prompts' lengths as the runs counted them.
			lens := make(map[string]int, len(lr.reqs))
			for _, o := range lr.runs[0].Outcomes {
				lens[o.Req.Prompt] = o.Result.PromptTokens
			}
			promptTokens := func(prompt string) int { return lens[prompt] }
			workContext := bench.MeanContext(work, promptTokens)
			// The p99 and slowest-response floors at a capacity.
			floors := func(capacity float64) (p99, slowest time.Duration) {
				on := bench.CapacityLanes(capacity, costs, b.maxBatch)
				return bench.ResponseFloor(work, on, b.maxBatch, 0.99, promptTokens), bench.ResponseFloor(work, on, b.maxBatch, 1, promptTokens)
			}
			probeRate := bench.RateAtContext(best, ref, workContext, costs, b.maxBatch)
			floor, maxFloor := floors(probeRate)
			// Again at the fastest any run decoded, which a live run
			// reaches where a burst probe's rate may not be.
			var runFloor, runMaxFloor time.Duration
			rate := bench.BestRate(lr.runs, costs, b.maxBatch, workContext)
			if b.loads[li] >= topLoad {
				topLoad, topRate, topContext, topBest = b.loads[li], rate, workContext, probeRate
			}
			if rate > 0 {
				runFloor, runMaxFloor = floors(rate)
			}
			for _, i := range lr.rows {
				shareRows[i].P99Floor, shareRows[i].MaxFloor = floor, maxFloor
				shareRows[i].RunP99Floor, shareRows[i].RunMaxFloor = runFloor, runMaxFloor
			}
		}
		rows = append(rows, shareRows...)
		// The runs the rows came from: a share whose runs were redone
		// from a higher capacity writes only the second round's.
		// Policies take turns within each repeat: the policy's row names
		// the setting, a run's index over the policies is its repeat.
		np := len(b.policies)
		for _, lr := range byLoad {
			for i, run := range lr.runs {
				if err := b.writeOutcomes(shareRows[lr.rows[i%np]], i/np, run); err != nil {
					return nil, "", err
				}
			}
		}
		capNote := fmt.Sprintf("%.0f tok/s at %.0f%% adversarial (%.0f after its runs", c.Used.Rate, 100*adv, c.After.Rate)
		if c.Rerun {
			capNote = fmt.Sprintf("%.0f tok/s at %.0f%% adversarial (runs redone: the first probe read %.0f; %.0f after them",
				c.Used.Rate, 100*adv, c.First.Rate, c.After.Rate)
		}
		if bestBatch < b.maxBatch {
			capNote += fmt.Sprintf("; fastest at %d a step", bestBatch)
		}
		var lagP99, lagMax time.Duration // the clients' lateness, over this share's runs
		var prompt, reused int
		for _, lr := range byLoad {
			for _, r := range lr.runs {
				lagP99, lagMax = max(lagP99, r.SubmitLagP99), max(lagMax, r.SubmitLagMax)
				prompt, reused = prompt+r.PromptTokens, reused+r.ReusedTokens
			}
		}
		if prompt > 0 {
			capNote += fmt.Sprintf("; prefix reuse took %.1f%% of the runs' prompt tokens from finished requests' KV caches", 100*float64(reused)/float64(prompt))
		}
		capNote += fmt.Sprintf("; at load %.2f the floors' rates, at the answers' mean context of %.0f tokens, are %.0f from the probes and %.0f from the runs; answers %.1f tokens on average, the workload asks %.1f; the clients submitted up to %v after a request's arrival time, %v at the 99th percentile)",
			topLoad, topContext, topBest, topRate, answerLen, meanTokens(work), lagMax.Round(10*time.Microsecond), lagP99.Round(10*time.Microsecond))
		capacities = append(capacities, capNote)
	}
	var inIsolation []string
	for i, c := range costs {
		inIsolation = append(inIsolation, fmt.Sprintf("%s %v + %v/member at %d of context + %v/member/context token + %v/prefill token", lanes[i].Name,
			c.A.Round(time.Microsecond), c.B.Round(time.Microsecond), c.BAt, c.D, c.C.Round(100*time.Nanosecond)))
	}
	note := fmt.Sprintf("%s: lanes %s; %s; live capacity on the workload (all lanes, full batches; the floors assume the fastest probe at any batch cap, or the fastest a run decoded, and the answers the model gave) %s; one request alone %.0f tok/s; step cost in isolation %s; estimator %s",
		name, describeLanes(lanes, specs), runsNote(b.repeat), strings.Join(capacities, ", "), 1/tokTime.Seconds(), strings.Join(inIsolation, ", "), calPath)
	return rows, note, nil
}

// fastLanes are the lanes whose full-batch rate is within sched.SlowLane
// of the fastest's (those the scheduler counts alike). The answers' lengths are
// the model's on any lane, and are measured on these: a CPU lane beside
// a GPU would take minutes over its share of a whole workload.
func fastLanes(costs []bench.StepCosts, batch int) []int {
	var fastest float64
	for _, c := range costs {
		fastest = max(fastest, c.Capacity(batch))
	}
	var out []int
	for i, c := range costs {
		if sched.SlowLane*c.Capacity(batch) >= fastest {
			out = append(out, i)
		}
	}
	return out
}

// longContext is the context laneStepCosts times full batches at again
// for the cost of context (StepCosts.D): about the longest the real
// runs reach, whose answers stop 64 tokens short of a 512 context.
const longContext = 448

// laneStepCosts measures the step costs of each lane's device and
// threads (once for lanes that are alike): they seed the lanes' cost
// models, which a GPU lane and a CPU lane need apart.
func laneStepCosts(f *weights.File, specs []sched.LaneSpec, maxBatch int, stderr io.Writer) ([]bench.StepCosts, error) {
	costs := make([]bench.StepCosts, len(specs))
	for i, sp := range specs {
		if j := slices.IndexFunc(specs, func(o sched.LaneSpec) bool { return o.String() == sp.String() }); j < i {
			costs[i] = costs[j]
			continue
		}
		where, threads := fmt.Sprintf("%d thread(s)%s", sp.Threads, sp.CPUs.Where()), sp.Threads
		if sp.GPU() {
			where, threads = sp.Device, 1 // as sched.LoadLanes runs a GPU lane's host side
		}
		fmt.Fprintf(stderr, "measuring step costs of %s on %s\n", filepath.Base(f.Path), where)
		c, err := bench.MeasureStepCosts(f, bench.CostConfig{Threads: threads, Device: sp.Device, CPUs: sp.CPUs, Batches: []int{1, 2, 4, maxBatch}, LongContext: longContext})
		if err != nil {
			return nil, fmt.Errorf("lane %d (%s): %w", i, where, err)
		}
		costs[i] = c
	}
	return costs, nil
}

// calibrationLanes are the lanes an in-memory calibration generates on:
// the benchmark's own when one is a GPU (the GPU is the fast way), else
// one CPU lane per core.
func calibrationLanes(specs []sched.LaneSpec) []sched.LaneSpec {
	if slices.ContainsFunc(specs, sched.LaneSpec.GPU) {
		return specs
	}
	return onePerCore()
}

func runsNote(n int) string {
	if n == 1 {
		return "one run per setting and policy"
	}
	return fmt.Sprintf("each row the median of %d runs (policies taking turns)", n)
}

// simStepCosts parses --sim-costs or measures the step costs of a
// synthetic model of shape (written to a temporary directory and
// removed).
func simStepCosts(shape, typ, given string, threads int, stderr io.Writer) ([]bench.StepCosts, string, error) {
	if given != "" {
		var costs []bench.StepCosts
		var notes []string
		for _, lane := range strings.Split(given, "/") {
			ms, err := parseFloats("--sim-costs", lane, 0, 1e6)
			if err != nil || len(ms) < 3 || len(ms) > 4 || ms[0]+ms[1] <= 0 {
				return nil, "", fmt.Errorf("%w: --sim-costs %q: want three or four numbers of milliseconds A,B,C[,D] per lane (lanes separated by /), with a step of one member (A+B) above 0", errUsage, given)
			}
			d := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
			c := bench.StepCosts{Name: "sim", A: d(ms[0]), B: d(ms[1]), C: d(ms[2]), MaxSeqs: 16, Context: 2048}
			note := fmt.Sprintf("%v + %v/member + %v/prefill token", c.A, c.B, c.C)
			if len(ms) == 4 {
				c.D = d(ms[3]) // B is then a member's cost at no context (BAt 0)
				note = fmt.Sprintf("%v + %v/member + %v/member/context token + %v/prefill token", c.A, c.B, c.D, c.C)
			}
			costs = append(costs, c)
			notes = append(notes, note)
		}
		if len(costs) == 1 {
			return costs, "sim: given step costs " + notes[0], nil
		}
		for i := range notes {
			notes[i] = fmt.Sprintf("lane %d %s", i, notes[i])
		}
		return costs, "sim: given step costs " + strings.Join(notes, ", "), nil
	}
	sh, err := weights.LookupShape(shape)
	if err != nil {
		return nil, "", fmt.Errorf("%w: --sim-shape: %v", errUsage, err)
	}
	dt, err := weights.ParseDType(typ)
	if err != nil {
		return nil, "", fmt.Errorf("%w: --sim-type: %v", errUsage, err)
	}
	// Ctrl-C while the model is written or measured removes it and exits.
	defer interrupt.Handle(stderr, "tandem bench")()
	dir, untrack, err := interrupt.Create(func() (string, error) { return os.MkdirTemp("", "tandem-bench-sched-") })
	if err != nil {
		return nil, "", err
	}
	defer untrack()
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", sh.Name, strings.ToLower(dt.String())))
	bar := progress.New(stderr, "synth "+filepath.Base(path), 0)
	err = weights.Synth(path, weights.SynthOptions{Shape: sh, Type: dt, Seed: 1,
		Progress: func(done, total uint64) { bar.SetTotal(total); bar.Set(done) }})
	bar.Done()
	if err != nil {
		return nil, "", err
	}
	f, err := weights.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	fmt.Fprintf(stderr, "measuring step costs of %s with %d thread(s)\n", filepath.Base(path), threads)
	c, err := bench.MeasureStepCosts(f, bench.CostConfig{Threads: threads, Batches: []int{1, 2, 4, 8}, Reps: 3})
	if err != nil {
		return nil, "", err
	}
	c.Name = "sim " + sh.Name
	return []bench.StepCosts{c}, fmt.Sprintf("%s (%s): measured step = %v + %v/member + %v/prefill token with %d thread(s) (one sequence: %.2f tok/s)",
		c.Name, strings.ToLower(dt.String()), c.A.Round(time.Millisecond), c.B.Round(time.Microsecond), c.C.Round(time.Microsecond), threads,
		1/c.TokenTime().Seconds()), nil
}

// sim runs the policies in the simulator on lanes of these step costs;
// the first lane's sets the workload's deadlines (its time per token
// alone) and context.
func (b schedBench) sim(ctx context.Context, costs []bench.StepCosts, n int, ablate bool) ([]bench.SchedRow, error) {
	cost := costs[0]
	if cost.Name == "" {
		cost.Name = "sim"
	}
	lanes := slices.Clone(costs)
	for i := range lanes {
		lanes[i].Name = fmt.Sprintf("%s lane %d", cost.Name, i)
	}
	pols := b.policies
	if ablate {
		for _, a := range ablations {
			if !slices.ContainsFunc(pols, func(p policyVariant) bool { return p.name == a.name }) {
				pols = append(pols, a)
			}
		}
	}
	tokTime := simTokenTime(cost)
	total := len(b.variances) * len(b.adversarial) * len(b.loads) * len(pols)
	bar := progress.NewCount(b.stderr, "simulated runs", uint64(total), "runs")
	defer bar.Done()
	var rows []bench.SchedRow
	done := uint64(0)
	for _, v := range b.variances {
		est, err := simEstimator(ctx, v, b.seed)
		if err != nil {
			return nil, err
		}
		for _, adv := range b.adversarial {
			for _, load := range b.loads {
				rate := b.rate(load, lanes, adv, v, tokTime)
				reqs := bench.Workload(bench.WorkloadConfig{Requests: n, Rate: rate, Adversarial: adv, Variance: v,
					TokenTime: tokTime, MaxTokens: cost.Context - 64, Seed: b.seed})
				floor := bench.ResponseFloor(reqs, lanes, b.maxBatch, 0.99, nil)
				maxFloor := bench.ResponseFloor(reqs, lanes, b.maxBatch, 1, nil)
				for _, p := range pols {
					if err := ctx.Err(); err != nil {
						return nil, err // Ctrl-C: a run takes seconds at most
					}
					run, err := bench.Simulate(reqs, bench.SimConfig{Sched: sched.Config{Policy: p.policy, Ablate: p.ablate,
						MaxBatch: b.maxBatch, MaxQueue: n + 1}, Estimator: est, Lanes: lanes})
					if err != nil {
						return nil, err
					}
					row := bench.Summarize(run)
					row.Engine, row.Policy, row.Load, row.Rate, row.Adversarial, row.Variance = cost.Name, p.name, load, rate, adv, v.String()
					row.P99Floor, row.MaxFloor = floor, maxFloor
					rows = append(rows, row)
					if err := b.writeOutcomes(row, 0, run); err != nil {
						return nil, err
					}
					done++
					bar.Set(done)
				}
			}
		}
	}
	return rows, nil
}

// simTokenTime is the simulated workload's deadline unit, as the real
// engine measures it (LiveTokenTime): one request alone, 64 tokens from
// a short prompt (about 7 tokens), so at a mean context of about 39.
func simTokenTime(c bench.StepCosts) time.Duration { return c.AtContext(39).TokenTime() }

// simEstimator trains the estimator on simulated generations: a held-out
// workload (another seed) with the lengths the simulator will produce.
func simEstimator(ctx context.Context, v bench.Variance, seed uint64) (*sched.Estimator, error) {
	reqs := bench.CalibrationPrompts(1000, v, 1<<20, seed+500)
	var xs [][]float64
	var ys []float64
	for _, r := range reqs {
		words := len(strings.Fields(r.Prompt))
		f := sched.Extract(r.Prompt, 1+int(math.Ceil(1.3*float64(words))))
		xs = append(xs, f[:])
		ys = append(ys, float64(min(r.Natural, r.MaxTokens)))
	}
	m, err := sched.TrainMLPContext(ctx, xs, ys, sched.TrainOptions{Seed: seed, Epochs: 600})
	if err != nil {
		return nil, err
	}
	var scores []float64
	for _, x := range xs {
		scores = append(scores, m.Predict(x))
	}
	return sched.NewEstimator(&sched.Calibration{MLP: m, Scores: sched.Percentiles(scores)}), nil
}

// shellLine writes args as a shell reads them back: an empty argument
// (an empty --sim-shape) or one with spaces or quotes in single quotes, so the
// report's command line can be pasted to run again.
func shellLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"$`\\;&|<>*?()[]{}!#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
