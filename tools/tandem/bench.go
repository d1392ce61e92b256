package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "stream":
			return runBenchStream(args[1:], stdout, stderr)
		case "spec":
			return runBenchSpec(args[1:], stdout, stderr)
		case "sched":
			return runBenchSched(args[1:], stdout, stderr)
		}
	}
	if len(args) == 0 || args[0] != "decode" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintln(stdout, "Usage: tandem bench decode|stream|spec|sched [flags]\n\nBenchmarks:\n"+
				"  decode   single-sequence decode and prefill speed against the memory bound\n"+
				"  stream   per-token latency with weights streamed under a budget, against the IO bound\n"+
				"  spec     speculative decoding (tree, sd, bild, ablations) against the target alone, streamed\n"+
				"  sched    the request scheduler: policies under load, real engine and simulator\n\n"+
				"tandem bench NAME --help explains each.")
			return nil
		}
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			return fmt.Errorf("%w: unknown benchmark %q: want tandem bench decode|stream|spec|sched [flags]", errUsage, args[0])
		}
		return fmt.Errorf("%w: want a benchmark name: tandem bench decode|stream|spec|sched [flags]", errUsage)
	}
	defer interrupt.Handle(stderr, "tandem bench")() // Ctrl-C removes the models made for the run
	fs := newFlags("bench decode", "[--model FILE | --shape NAME --types T,...] [--threads N,...] [flags]",
		"Measures prefill of a random --prompt-token prompt and greedy single-sequence\n"+
			"decode, --runs times, and prints a markdown table (medians, the runs' range\n"+
			"in brackets) with each decode figure next to two bounds measured in the\n"+
			"same run: memory, read bandwidth (a buffer far larger than cache) ÷ weight\n"+
			"bytes read per token, and compute, tandem's own matrix-vector kernel on a\n"+
			"cache-resident matrix ÷ the same bytes. Whichever bound is lower is the\n"+
			"wall decode runs into.\n"+
			"Without --model it synthesizes a model of --shape for each of --types in\n"+
			"a temporary directory (removed afterwards; --dir keeps them).", stdout, stderr,
		"tandem bench decode --shape tinyllama-1.1b --types q4_0,q8_0,f16 --threads 1,2",
		"tandem bench decode --model model.gguf --threads 2 --runs 3")
	modelPath := fs.String("model", "", "benchmark this model instead of synthetic ones")
	shape := fs.String("shape", "tinyllama-1.1b", "shape of the synthetic models: a name (stories15m, stories110m, tinyllama-1.1b, llama2-7b) or dims D,H,L,HEADS,KV,VOCAB[,CTX]")
	types := fs.String("types", "q4_0,q8_0,f16", "weight types of the synthetic models")
	threads := fs.String("threads", "1,2", "thread counts to measure, comma separated (0: a thread per physical core, as elsewhere)")
	prompt := fs.Int("prompt", 512, "prefill prompt tokens")
	gen := fs.Int("gen", 32, "decoded tokens per run")
	runs := fs.Int("runs", 5, "runs per measurement (medians are reported, with the runs' range)")
	dir := fs.String("dir", "", "where synthetic models go (default: a new temporary directory)")
	backend := fs.String("kernels", "", "kernel backend: c or go")
	if _, err := parse(fs, args[1:], 0, 0); err != nil {
		return err
	}
	if *prompt < 1 || *gen < 1 || *runs < 1 {
		return fmt.Errorf("%w: --prompt %d, --gen %d, --runs %d: each must be at least 1", errUsage, *prompt, *gen, *runs)
	}
	if *backend != "" {
		if err := kernels.SetBackend(*backend); err != nil {
			return fmt.Errorf("%w: --kernels: %v", errUsage, err)
		}
	}
	var thr []int
	for _, s := range strings.Split(*threads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > kernels.MaxThreads {
			return fmt.Errorf("%w: --threads %q: want integers from 0 (a thread per physical core) to %d separated by commas", errUsage, *threads, kernels.MaxThreads)
		}
		if n == 0 {
			n = kernels.DefaultThreads()
		}
		thr = append(thr, n)
	}
	// Everything that can be wrong is found before the probe and the
	// synthesis, which take seconds to minutes.
	var sh weights.Shape
	var dts []weights.DType
	if *modelPath != "" {
		if err := modelMakes(fs, "shape", "types", "dir"); err != nil {
			return err
		}
		f, err := weights.Open(*modelPath)
		if err != nil {
			return err
		}
		mc, err := model.ConfigFrom(f)
		f.Close()
		if err != nil {
			return err
		}
		if need := *prompt + *gen; need > mc.Context {
			return fmt.Errorf("%w: --prompt %d + --gen %d tokens exceed the model's context of %d: lower --prompt (e.g. --prompt %d)", errUsage, *prompt, *gen, mc.Context, max(1, mc.Context-*gen))
		}
	} else {
		var err error
		if sh, err = shapeOrDims("--shape", *shape); err != nil {
			return err
		}
		if dts, err = writeTypes(*types); err != nil {
			return err
		}
		if *dir != "" {
			if err := keepDir(*dir); err != nil {
				return err
			}
		}
	}
	bw := map[int]float64{}
	for _, t := range thr {
		b := bench.MemoryBandwidth(t, 512<<20, 5)
		bw[t] = b.BytesPerSec
		fmt.Fprintf(stdout, "memory read bandwidth, %d thread(s): %.1f GB/s\n", t, b.BytesPerSec/1e9)
	}
	peak := map[bench.PeakKey]float64{}

	var models []string
	if *modelPath != "" {
		models = []string{*modelPath}
	} else {
		tmp := *dir // made above
		if tmp == "" {
			var untrack func()
			var err error
			if tmp, untrack, err = interrupt.Create(func() (string, error) { return os.MkdirTemp("", "tandem-bench-") }); err != nil {
				return err
			}
			defer untrack()
			defer os.RemoveAll(tmp)
		}
		for _, dt := range dts {
			path := filepath.Join(tmp, fmt.Sprintf("%s-%s.gguf", sh.Name, strings.ToLower(dt.String())))
			if _, err := os.Stat(path); err != nil {
				bar := progress.New(stderr, "synth "+filepath.Base(path), 0)
				err := weights.Synth(path, weights.SynthOptions{Shape: sh, Type: dt, Seed: 1,
					Progress: func(done, total uint64) { bar.SetTotal(total); bar.Set(done) }})
				bar.Done()
				if err != nil {
					return err
				}
			}
			models = append(models, path)
		}
	}

	var results []bench.DecodeResult
	for _, path := range models {
		f, err := weights.Open(path)
		if err != nil {
			return err
		}
		for _, t := range thr {
			_, typ := bench.WeightBytesPerToken(f)
			if dt, err := weights.ParseDType(typ); err == nil {
				key := bench.PeakKey{Type: typ, Threads: t}
				if _, ok := peak[key]; !ok {
					pool := kernels.NewPool(t)
					k, err := bench.KernelPeak(pool, dt, 256, 2048, 5)
					pool.Close()
					if err == nil {
						peak[key] = k.BytesPerSec
						fmt.Fprintf(stdout, "%s kernel on a cache-resident matrix, %d thread(s): %.1f GB/s of weights\n", typ, t, k.BytesPerSec/1e9)
					}
				}
			}
			r, err := bench.Decode(f, bench.DecodeConfig{Threads: t, PromptTokens: *prompt, DecodeTokens: *gen, Runs: *runs})
			if err != nil {
				f.Close()
				return err
			}
			results = append(results, r)
			fmt.Fprintf(stderr, "%s, %d thread(s): decode %.2f tok/s, prefill %.1f tok/s\n", filepath.Base(path), t, r.DecodeTokPerS, r.PrefillTokPerS)
		}
		f.Close()
	}
	fmt.Fprintf(stdout, "\nkernels: %s (%s); %d-token prefill, %d decoded tokens, %d runs (medians, the runs' range in brackets)\n\n", kernels.Backend(), kernels.Level(), *prompt, *gen, *runs)
	fmt.Fprint(stdout, bench.DecodeTable(results, bw, peak))
	return nil
}

// shapeOrDims resolves a benchmark's shape flag (named flag in errors):
// a known name, or dims D,H,L,HEADS,KV,VOCAB[,CTX] as inflate's --dims
// takes them.
func shapeOrDims(flag, s string) (weights.Shape, error) {
	if strings.Contains(s, ",") {
		sh, err := weights.ParseDims(s)
		if err != nil {
			return sh, fmt.Errorf("%w: %s: %v", errUsage, flag, err)
		}
		return sh, nil
	}
	sh, err := weights.LookupShape(s)
	if err != nil {
		return sh, fmt.Errorf("%w: %s %q: want one of %s, or dims D,H,L,HEADS,KV,VOCAB[,CTX]", errUsage, flag, s, strings.Join(weights.ShapeNames(), ", "))
	}
	return sh, nil
}

// writeTypes parses a benchmark's --types, all of them before any work:
// the types tandem can write models in.
func writeTypes(list string) ([]weights.DType, error) {
	var dts []weights.DType
	for _, s := range strings.Split(list, ",") {
		dt, err := weights.ParseWriteType(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: --types: %v", errUsage, err)
		}
		dts = append(dts, dt)
	}
	return dts, nil
}

// modelMakes refuses, with --model, the flags that say how to make the
// benchmark's models (which --model replaces): they were ignored, and
// `--model M --types f16` measured M's own types as asked.
func modelMakes(fs *flag.FlagSet, names ...string) error {
	return unusedFlags(fs, "says how to make the benchmark's models, and --model gives the model: leave one out", names...)
}
