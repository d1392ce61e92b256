package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

func runBenchStream(args []string, stdout, stderr io.Writer) error {
	defer interrupt.Handle(stderr, "tandem bench")() // Ctrl-C removes the unfinished output
	fs := newFlags("bench stream", "(--from SMALL [--shape NAME] [--types T,...] | --model FILE) [flags]",
		"Measures per-token decode latency with the model fully resident and with its\n"+
			"weights streamed under budgets (Std: read then compute; StdPL: the next\n"+
			"layers read while one computes), from the real disk (page cache dropped\n"+
			"first and behind every read) and from emulated storage. Each row sits next to\n"+
			"its IO lower bound, bytes read per token ÷ storage bandwidth (the disk's\n"+
			"measured cold), and the ratio achieved/bound. Targets are inflated from\n"+
			"--from (a real small model, so the tokens are real) to --shape for each of\n"+
			"--types in a temporary directory. Prints a markdown table, the goals, and\n"+
			"writes an SVG plot per type (latency vs budget) into --plots.", stdout, stderr,
		"tandem bench stream --from ../shared/models/stories260K.bin --shape tinyllama-1.1b --types q4_0,f16",
		"tandem bench stream --model target.gguf --budgets 50 --storage 400MB/s --runs 3")
	from := fs.String("from", "", "small model to inflate into the benchmark targets")
	modelPath := fs.String("model", "", "benchmark this model instead of inflated ones")
	shape := fs.String("shape", "tinyllama-1.1b", "shape the targets are inflated to: a name (stories15m, stories110m, tinyllama-1.1b, llama2-7b) or dims D,H,L,HEADS,KV,VOCAB[,CTX]")
	types := fs.String("types", "q4_0,f16", "weight types of the targets")
	budgets := fs.String("budgets", "25,50,75", "budgets in percent of the model's weights")
	storage := fs.String("storage", "disk,400MB/s,1.5GB/s", "storage to stream from: disk (the real one) or an emulated bandwidth")
	modes := fs.String("modes", "resident,std,stdpl", "modes to measure")
	runs := fs.Int("runs", 5, "measured runs per configuration (the median is reported)")
	tokens := fs.Int("tokens", 2, "decode tokens per run (a run's latency is its time ÷ tokens)")
	threads := threadsFlag(fs)
	ioMethod := fs.String("io", "pread", "how streamed weights are read: pread or mmap")
	dir := fs.String("dir", "", "where inflated targets go (default: a new temporary directory, removed afterwards)")
	plots := fs.String("plots", ".", "directory for the SVG plots (empty: none)")
	backend := fs.String("kernels", "", "kernel backend: c or go")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := plotsDir(*plots); err != nil {
		return err
	}
	if *backend != "" {
		if err := kernels.SetBackend(*backend); err != nil {
			return fmt.Errorf("%w: --kernels: %v", errUsage, err)
		}
	}
	var pcts []float64
	for _, s := range strings.Split(*budgets, ",") {
		v, err := units.ParsePercent(s)
		if err != nil {
			return fmt.Errorf("%w: --budgets %q: want percentages in (0, 100] separated by commas", errUsage, *budgets)
		}
		pcts = append(pcts, v)
	}
	var bws []float64
	for _, s := range strings.Split(*storage, ",") {
		s = strings.TrimSpace(s)
		if s == "disk" {
			bws = append(bws, 0)
			continue
		}
		bw, err := parseBandwidth(s)
		if err != nil || bw == 0 {
			return fmt.Errorf("%w: --storage %q: want disk or bandwidths like 400MB/s", errUsage, s)
		}
		bws = append(bws, bw)
	}
	if *runs < 1 || *tokens < 1 {
		return fmt.Errorf("%w: --runs %d, --tokens %d: want at least 1 each", errUsage, *runs, *tokens)
	}
	var modeList []string
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m != "resident" && m != "std" && m != "stdpl" {
			return fmt.Errorf("%w: --modes: %q is not resident, std or stdpl", errUsage, m)
		}
		modeList = append(modeList, m)
	}
	if !slices.Contains(modeList, "std") && !slices.Contains(modeList, "stdpl") {
		// A resident model streams nothing: these would be ignored.
		if err := unusedFlags(fs, "sets how std and stdpl stream, and --modes "+*modes+" runs neither", "budgets", "storage", "io"); err != nil {
			return err
		}
	}
	method := weights.IOPread
	switch *ioMethod {
	case "pread":
	case "mmap":
		method = weights.IOMmap
	default:
		return fmt.Errorf("%w: --io %q: want pread or mmap", errUsage, *ioMethod)
	}

	if *modelPath != "" {
		if err := modelMakes(fs, "shape", "types", "dir"); err != nil {
			return err
		}
	}
	models, cleanup, err := benchTargets(*modelPath, *from, "--shape", *shape, *types, *dir, stdout, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	start := time.Now()
	for _, path := range models {
		rs, err := streamSuite(path, modeList, pcts, bws, method, *threads, *runs, *tokens, stderr)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n### %s (%s of weights), %s kernels, median of %d runs of %d tokens\n\n", filepath.Base(path),
			progress.Bytes(rs[0].TotalBytes), kernels.Backend(), *runs, *tokens)
		fmt.Fprint(stdout, bench.StreamTable(rs))
		fmt.Fprintf(stdout, "\n%s", bench.StreamGoals(rs))
		if *plots != "" {
			name := filepath.Join(*plots, "stream-"+strings.ToLower(rs[0].Type)+".svg")
			title := fmt.Sprintf("%s: per-token latency vs budget", filepath.Base(path))
			if err := os.WriteFile(name, bench.StreamPlot(rs, title), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "\nplot: %s\n", name)
		}
	}
	fmt.Fprintf(stderr, "bench stream took %.0fs\n", time.Since(start).Seconds())
	return nil
}

// benchTargets returns the models to benchmark: --model, or --from
// inflated to shape in each type (and a cleanup for the temporary ones).
// shapeFlag names the shape's flag in errors.
func benchTargets(modelPath, from, shapeFlag, shape, types, dir string, stdout, stderr io.Writer) ([]string, func(), error) {
	none := func() {}
	switch {
	case modelPath != "" && from != "":
		return nil, none, fmt.Errorf("%w: give --model or --from, not both", errUsage)
	case modelPath != "":
		return []string{modelPath}, none, nil
	case from == "":
		return nil, none, fmt.Errorf("%w: --from SMALL (a real small model, e.g. ../shared/models/stories260K.bin) or --model FILE is required", errUsage)
	}
	sh, err := shapeOrDims(shapeFlag, shape)
	if err != nil {
		return nil, none, err
	}
	dts, err := writeTypes(types)
	if err != nil {
		return nil, none, err
	}
	cleanup := none
	if dir != "" {
		if err := keepDir(dir); err != nil {
			return nil, none, err
		}
	} else {
		var untrack func()
		if dir, untrack, err = interrupt.Create(func() (string, error) { return os.MkdirTemp("", "tandem-bench-stream-") }); err != nil {
			return nil, none, err
		}
		cleanup = func() { os.RemoveAll(dir); untrack() }
	}
	src, err := weights.Open(from)
	if err != nil {
		cleanup()
		return nil, none, err
	}
	defer src.Close()
	var models []string
	for _, dt := range dts {
		path := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.gguf", strings.TrimSuffix(filepath.Base(from), filepath.Ext(from)), sh.Name, strings.ToLower(dt.String())))
		if _, err := os.Stat(path); err != nil {
			bar := progress.New(stderr, "inflate "+filepath.Base(path), 0)
			err := weights.Inflate(src, path, weights.InflateOptions{Shape: sh, Type: dt,
				Progress: func(done, total uint64) { bar.SetTotal(total); bar.Set(done) }})
			bar.Done()
			if err != nil {
				cleanup()
				if errors.Is(err, weights.ErrInflateShape) {
					err = fmt.Errorf("%w: %v; choose another --shape", errUsage, err)
				}
				return nil, none, err
			}
		}
		models = append(models, path)
	}
	return models, cleanup, nil
}

// streamSuite measures one model: resident, then per storage and budget
// std and stdpl back to back (so drift in the machine's load hits both).
func streamSuite(path string, modes []string, pcts, bws []float64, method weights.IOMethod, threads, runs, tokens int, stderr io.Writer) ([]bench.StreamResult, error) {
	diskBW, err := bench.DiskBandwidth(path, 1<<30)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "%s: disk reads it cold at %.0f MB/s\n", filepath.Base(path), diskBW/1e6)
	f, err := weights.Open(path)
	if err != nil {
		return nil, err
	}
	plan, _, err := modelPlan(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	var rs []bench.StreamResult
	run := func(cfg bench.StreamConfig) error {
		cfg.Method, cfg.Threads, cfg.Runs, cfg.Tokens, cfg.DiskBW = method, threads, runs, tokens, diskBW
		r, err := bench.Stream(path, cfg)
		if err != nil {
			return fmt.Errorf("bench stream %s %s budget %d: %w", filepath.Base(path), cfg.Mode, cfg.Budget, err)
		}
		var each []string
		for _, d := range r.RunTimes {
			each = append(each, fmt.Sprintf("%.0f", d.Seconds()*1e3))
		}
		fmt.Fprintf(stderr, "%-8s %-16s budget %-10s %7.0f ms/token (bound %.0f ms; runs %s ms)\n", cfg.Mode, r.Storage(),
			progress.Bytes(cfg.Budget), r.Token.Seconds()*1e3, r.Bound.Seconds()*1e3, strings.Join(each, " "))
		rs = append(rs, r)
		return nil
	}
	for _, m := range modes {
		if m == "resident" {
			if err := run(bench.StreamConfig{Mode: "resident"}); err != nil {
				return nil, err
			}
		}
	}
	for _, bw := range bws {
		for _, p := range pcts {
			budget := uint64(p / 100 * float64(plan))
			for _, m := range modes {
				if m == "resident" {
					continue
				}
				if err := run(bench.StreamConfig{Mode: m, Budget: budget, Bandwidth: bw}); err != nil {
					return nil, err
				}
			}
		}
	}
	return rs, bench.SameTokens(rs)
}

// modelPlan returns the bytes of f's streamable weights.
func modelPlan(f *weights.File) (total uint64, groups []weights.Group, err error) {
	p, groups, err := model.PlanStream(f, weights.StreamOptions{})
	if p.Total == 0 && err != nil {
		return 0, nil, err
	}
	return p.Total, groups, nil
}

// plotsDir creates the --plots folder before a benchmark starts: finding
// it missing when the plot is written would lose the run's minutes. A
// folder it makes goes if the run is interrupted; the plots come last.
func plotsDir(dir string) error {
	if dir == "" {
		return nil
	}
	_, err := reportDir("--plots", dir)
	return err
}
