package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

func runBenchSpec(args []string, stdout, stderr io.Writer) error {
	defer interrupt.Handle(stderr, "tandem bench")() // Ctrl-C removes the unfinished output
	fs := newFlags("bench spec", "--from SMALL --draft DRAFT --prompts FILE [flags]",
		"Measures per-token latency of speculative decoding against the target alone,\n"+
			"with the target streamed under budgets from the real disk (page cache dropped)\n"+
			"and from emulated storage. The target is --from (a real small model) inflated\n"+
			"to --shape for each of --types, so the draft's agreement with it is real; the\n"+
			"draft is --draft, resident (optionally inflated to --draft-shape, for a draft\n"+
			"with real cost). Modes: std and stdpl (the target alone), sd (its draft\n"+
			"length tuned first), bild, tree and the tree's ablations. Each row gives the\n"+
			"median of --runs runs of --tokens tokens (timed from the prompt), tokens per\n"+
			"target pass, speedups over std and over the best sd measured alongside, and\n"+
			"agreement: the share of its tokens equal to the target alone's (resident, run\n"+
			"for --tokens tokens after the timed modes; any other than bild below 1 stops\n"+
			"the benchmark with an error);\n"+
			"then the goals, the verification cost curve, acceptance by depth, the rank of\n"+
			"the target's tokens among the draft's choices with the best tree of each size\n"+
			"those ranks allow, and an SVG plot per type.", stdout, stderr,
		"tandem bench spec --from ../shared/models/stories260K.bin --draft ../shared/models/llama2xs_model.bin --prompts ../shared/testdata/stories260K.greedy.jsonl",
		"tandem bench spec --from stories260K.bin --draft llama2xs_model.bin --prompts p.jsonl --types q4_0 --budgets 25 --storage 400MB/s --runs 5")
	from := fs.String("from", "", "small target model to inflate")
	draftPath := fs.String("draft", "", "draft model (resident)")
	draftShape := fs.String("draft-shape", "", "inflate the draft to this shape first (e.g. stories110m), for a draft with real cost")
	promptsPath := fs.String("prompts", "", "JSON lines with prompt_ids (the greedy reference vectors)")
	shape := fs.String("shape", "tinyllama-1.1b", "shape the target is inflated to: a name (stories15m, stories110m, tinyllama-1.1b, llama2-7b) or dims D,H,L,HEADS,KV,VOCAB[,CTX]")
	types := fs.String("types", "q4_0,f16", "weight types of the target")
	budgets := fs.String("budgets", "25,50", "target budgets in percent of its weights")
	storage := fs.String("storage", "400MB/s,1.5GB/s,disk", "storage the target streams from: disk or an emulated bandwidth")
	modes := fs.String("modes", "", "modes to measure (default: all: "+strings.Join(specModes, ",")+")")
	sdLens := fs.String("sd-lens", "2,3,4,6,8", "sd draft lengths tried on the first configuration; the fastest is used throughout")
	maxTree := fs.Int("max-tree", spec.DefaultMaxTree, "tree modes: most drafted tokens per verification")
	maxBranches := fs.Int("max-branches", spec.DefaultMaxBranches, "tree modes: most branches open at once")
	threshold := fs.Float64("branch-threshold", spec.DefaultBranchThreshold, "tree modes: draft probability a candidate needs to open a branch")
	runs := fs.Int("runs", 5, "runs per mode (the median is reported)")
	tokens := fs.Int("tokens", 32, "tokens generated per run of a speculative mode")
	stdTokens := fs.Int("std-tokens", 8, "tokens generated per run of the target alone (every one costs a full pass)")
	threads := threadsFlag(fs)
	dir := fs.String("dir", "", "where inflated models go (default: a temporary directory, removed afterwards)")
	plots := fs.String("plots", ".", "directory for the SVG plots (empty: none)")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *from == "" || *draftPath == "" || *promptsPath == "" {
		return fmt.Errorf("%w: --from, --draft and --prompts are required", errUsage)
	}
	if *runs < 1 || *tokens < 1 || *stdTokens < 1 {
		return fmt.Errorf("%w: --runs %d, --tokens %d, --std-tokens %d: want at least 1 each", errUsage, *runs, *tokens, *stdTokens)
	}
	want := map[string]bool{}
	if *modes != "" {
		for _, m := range strings.Split(*modes, ",") {
			m = strings.TrimSpace(m)
			if !slices.Contains(specModes, m) {
				return fmt.Errorf("%w: --modes: %q is not one of %s", errUsage, m, strings.Join(specModes, ", "))
			}
			want[m] = true
		}
	}
	if len(want) > 0 {
		// Flags that tune modes the run leaves out: bad usage, as elsewhere.
		trees := false
		for m := range want {
			trees = trees || strings.HasPrefix(m, "tree")
		}
		if !trees {
			if err := unusedFlags(fs, "shapes the tree modes, and --modes "+*modes+" has none", "max-tree", "max-branches", "branch-threshold"); err != nil {
				return err
			}
		}
		if !want["sd"] {
			if err := unusedFlags(fs, "sets sd's draft lengths, and --modes "+*modes+" leaves sd out", "sd-lens"); err != nil {
				return err
			}
		}
	}
	if *maxTree < 1 || *maxBranches < 1 || *maxTree > maxTreeSize || *maxBranches > maxTreeSize || !(*threshold > 0 && *threshold < 1) {
		return fmt.Errorf("%w: --max-tree %d, --max-branches %d, --branch-threshold %g: want sizes from 1 to %d and a threshold in (0,1)", errUsage, *maxTree, *maxBranches, *threshold, maxTreeSize)
	}
	pcts, err := parsePercents(*budgets)
	if err != nil {
		return err
	}
	bws, err := parseStorage(*storage)
	if err != nil {
		return err
	}
	var lens []int
	for _, s := range strings.Split(*sdLens, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 {
			return fmt.Errorf("%w: --sd-lens %q: want positive integers", errUsage, *sdLens)
		}
		lens = append(lens, k)
	}
	if err := plotsDir(*plots); err != nil {
		return err
	}
	prompts, err := readPromptIDs(*promptsPath)
	if err != nil {
		return err
	}
	if err := checkSpecInputs(*from, *draftPath, *promptsPath, prompts); err != nil {
		return err
	}
	treeShape := spec.Config{BranchThreshold: *threshold, MaxBranches: *maxBranches, MaxTree: *maxTree}
	targets, cleanup, err := benchTargets("", *from, "--shape", *shape, *types, *dir, stdout, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	draft := *draftPath
	if *draftShape != "" {
		ds, cleanDraft, err := benchTargets("", *draftPath, "--draft-shape", *draftShape, "q8_0", filepath.Dir(targets[0]), stdout, stderr)
		if err != nil {
			return err
		}
		defer cleanDraft()
		draft = ds[0]
	}
	start := time.Now()
	for _, target := range targets {
		diskBW, err := bench.DiskBandwidth(target, 1<<30)
		if err != nil {
			return err
		}
		f, err := weights.Open(target)
		if err != nil {
			return err
		}
		total, _, err := modelPlan(f)
		f.Close()
		if err != nil {
			return err
		}
		var rs []bench.SpecResult
		measure := func(mode bench.SpecMode, budget uint64, bw float64, runs int) (bench.SpecResult, error) {
			cfg := bench.SpecConfig{Target: target, Draft: draft, Mode: mode, Budget: budget, Bandwidth: bw, DiskBW: diskBW,
				Threads: *threads, Prompts: prompts, Runs: runs, Tokens: *tokens}
			if !mode.Speculative {
				cfg.Tokens = *stdTokens
			}
			r, err := bench.Spec(cfg)
			if err != nil {
				return r, err
			}
			fmt.Fprintf(stderr, "%-14s %-16s budget %-10s %7.0f ms/token, %.2f tokens/pass\n", mode.Name, r.Storage(), progress.Bytes(budget), r.Token.Seconds()*1e3, r.TokensPerPass())
			return r, nil
		}
		// Tune SD's draft length on the first configuration.
		best, bestTime := lens[0], time.Duration(0)
		budget0 := uint64(pcts[0] / 100 * float64(total))
		if len(lens) > 1 {
			for _, k := range lens {
				r, err := measure(bench.SpecModes(k, treeShape)[2], budget0, bws[0], max(3, *runs/2))
				if err != nil {
					return err
				}
				if bestTime == 0 || r.Token < bestTime {
					best, bestTime = k, r.Token
				}
			}
			fmt.Fprintf(stdout, "sd draft length tuned on %s at %.0f%%: k=%d\n", storageName(bws[0], diskBW), pcts[0], best)
		}
		for _, bw := range bws {
			for _, p := range pcts {
				budget := uint64(p / 100 * float64(total))
				for _, mode := range bench.SpecModes(best, treeShape) {
					base := strings.SplitN(mode.Name, "(", 2)[0]
					if len(want) > 0 && !want[base] {
						continue
					}
					r, err := measure(mode, budget, bw, *runs)
					if err != nil {
						return fmt.Errorf("bench spec %s %s: %w", filepath.Base(target), mode.Name, err)
					}
					rs = append(rs, r)
				}
			}
		}
		// Every lossless mode's every token is checked against the
		// target alone, its weights read in place.
		ref, err := bench.SpecReference(bench.SpecConfig{Target: target, Threads: *threads, Prompts: prompts, Runs: *runs,
			Tokens: max(*tokens, *stdTokens)})
		if err != nil {
			return err
		}
		if err := bench.Lossless(rs, ref); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n### target %s (%s of weights), draft %s, %s kernels, median of %d runs (%d tokens speculative, %d alone)\n\n",
			filepath.Base(target), progress.Bytes(total), filepath.Base(draft), kernels.Backend(), *runs, *tokens, *stdTokens)
		fmt.Fprint(stdout, bench.SpecTable(rs, ref))
		fmt.Fprint(stdout, "\n"+specGoals(rs))
		if err := specCurves(rs, target, draft, prompts, *threads, diskBW, stdout); err != nil {
			return err
		}
		if *plots != "" {
			for _, p := range pcts {
				var sel []bench.SpecResult
				for _, r := range rs {
					if r.Config.Budget == uint64(p/100*float64(total)) {
						sel = append(sel, r)
					}
				}
				name := filepath.Join(*plots, fmt.Sprintf("spec-%s-%.0f.svg", strings.ToLower(rs[0].Type), p))
				title := fmt.Sprintf("%s, budget %.0f%%: per-token latency", filepath.Base(target), p)
				if err := os.WriteFile(name, bench.SpecPlot(sel, title), 0o644); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "plot: %s\n", name)
			}
		}
	}
	fmt.Fprintf(stderr, "bench spec took %.0fs\n", time.Since(start).Seconds())
	return nil
}

// specGoals checks the goals: at the smallest budget on the
// slowest storage, tree at least 5x std and 1.5x sd, and tokens per
// target pass at least 1.3x sd's.
func specGoals(rs []bench.SpecResult) string {
	var sb strings.Builder
	for _, r := range rs {
		if r.Config.Mode.Name != "tree" {
			continue
		}
		var std, sd *bench.SpecResult
		for i := range rs {
			p := &rs[i]
			if p.Config.Budget != r.Config.Budget || p.Config.Bandwidth != r.Config.Bandwidth {
				continue
			}
			if p.Config.Mode.Name == "std" {
				std = p
			}
			if strings.HasPrefix(p.Config.Mode.Name, "sd(") {
				sd = p
			}
		}
		line := fmt.Sprintf("- %s, %s, budget %.0f%%: tree", r.Type, r.Storage(), 100*float64(r.Config.Budget)/float64(r.TotalBytes))
		if std != nil {
			line += fmt.Sprintf(" %.2fx std (goal 5x: %s)", std.Token.Seconds()/r.Token.Seconds(), verdict(std.Token.Seconds()/r.Token.Seconds() >= 5))
		}
		if sd != nil {
			line += fmt.Sprintf(", %.2fx %s (goal 1.5x: %s), tokens/pass %.2f vs %.2f = %.2fx (goal 1.3x: %s)",
				sd.Token.Seconds()/r.Token.Seconds(), sd.Config.Mode.Name, verdict(sd.Token.Seconds()/r.Token.Seconds() >= 1.5),
				r.TokensPerPass(), sd.TokensPerPass(), r.TokensPerPass()/sd.TokensPerPass(), verdict(r.TokensPerPass()/sd.TokensPerPass() >= 1.3))
		}
		sb.WriteString(line + "\n")
	}
	return sb.String()
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// specCurves prints the verification cost of the target by tree size and
// the tree's acceptance by depth, the two curves a tree's size trades.
func specCurves(rs []bench.SpecResult, target, draft string, prompts [][]int32, threads int, diskBW float64, w io.Writer) error {
	var tree *bench.SpecResult
	for i := range rs {
		if rs[i].Config.Mode.Name == "tree" {
			tree = &rs[i]
			break
		}
	}
	if tree == nil {
		return nil
	}
	sizes := []int{1, 2, 4, 8, 16, 32, 64, 96, 128}
	costs, err := bench.VerifyCost(bench.SpecConfig{Target: target, Budget: tree.Config.Budget, Bandwidth: tree.Config.Bandwidth,
		DiskBW: diskBW, Threads: threads, Prompts: prompts}, sizes)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nverification cost by tree size (%s, budget %.0f%%, median of 3 passes):\n\n| tokens | ms/pass | ms per token |\n|---|---|---|\n",
		tree.Storage(), 100*float64(tree.Config.Budget)/float64(tree.TotalBytes))
	for i, n := range sizes {
		fmt.Fprintf(w, "| %d | %.0f | %.1f |\n", n, costs[i].Seconds()*1e3, costs[i].Seconds()*1e3/float64(n))
	}
	curve := bench.AcceptanceCurve(tree.Stats)
	fmt.Fprintf(w, "\ntree acceptance by depth (share of passes accepting at least d drafted tokens):\n\n| d |")
	for d := range curve {
		fmt.Fprintf(w, " %d |", d)
	}
	fmt.Fprint(w, "\n|---|")
	for range curve {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprint(w, "\n| share |")
	for _, v := range curve {
		fmt.Fprintf(w, " %.2f |", v)
	}
	fmt.Fprintln(w)
	return treeBound(*tree, draft, threads, w)
}

// treeBound prints how well the draft predicts the target (the rank of
// the target's token among the draft's choices, along the tree runs'
// outputs) and what the best tree of each size could gain from that:
// the ceiling a tree policy works under with this draft.
func treeBound(tree bench.SpecResult, draft string, threads int, w io.Writer) error {
	const maxRank = 8
	var prompts [][]int32
	for r := range tree.Outputs {
		prompts = append(prompts, tree.Config.Prompt(r))
	}
	ranks, n, err := bench.DraftRanks(draft, threads, prompts, tree.Outputs, maxRank)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\ndraft rank of the target's token (share of the %d positions the tree runs emitted):\n\n| rank |", n)
	for k := range ranks {
		fmt.Fprintf(w, " %d |", k+1)
	}
	fmt.Fprintf(w, " >%d |\n|---|%s---|\n| share |", maxRank, strings.Repeat("---|", maxRank))
	rest := 1.0
	for _, v := range ranks {
		fmt.Fprintf(w, " %.3f |", v)
		rest -= v
	}
	fmt.Fprintf(w, " %.3f |\n", max(0, rest))
	sizes := []int{8, 16, 32, 64, 96, 128}
	best := bench.BestTrees(ranks, sizes[len(sizes)-1])
	fmt.Fprint(w, "\nbest tree for these ranks (Sequoia's dynamic program, every position alike and independent):\n\n| drafted tokens |")
	for _, s := range sizes {
		fmt.Fprintf(w, " %d |", s)
	}
	fmt.Fprintf(w, "\n|---|%s\n| tokens/pass |", strings.Repeat("---|", len(sizes)))
	for _, s := range sizes {
		fmt.Fprintf(w, " %.2f |", best[s])
	}
	fmt.Fprintf(w, "\n\nmeasured: tree %.2f tokens/pass, %.1f tokens verified per pass\n", tree.TokensPerPass(),
		float64(tree.Stats.Verified)/float64(max(1, tree.Stats.TargetPasses)))
	return nil
}

func storageName(bw, disk float64) string {
	if bw > 0 {
		return fmt.Sprintf("%.0f MB/s", bw/1e6)
	}
	return fmt.Sprintf("disk (%.0f MB/s)", disk/1e6)
}

// readPromptIDs reads prompt_ids from JSON lines.
func readPromptIDs(path string) ([][]int32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--prompts: %w", err)
	}
	defer f.Close()
	var out [][]int32
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	line := 1
	for ; sc.Scan(); line++ {
		var rec struct {
			PromptIDs []int32 `json:"prompt_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("--prompts: %s line %d: %w", path, line, err)
		}
		if len(rec.PromptIDs) == 0 {
			return nil, fmt.Errorf("--prompts: %s line %d has no prompt_ids", path, line)
		}
		out = append(out, rec.PromptIDs)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("--prompts: %s line %d is over 64 MiB; each line holds one prompt's ids", path, line)
	} else if err != nil {
		return nil, fmt.Errorf("--prompts: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--prompts: %s holds no prompts", path)
	}
	return out, nil
}

// parsePercents parses a list of budget percentages.
func parsePercents(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		v, err := units.ParsePercent(p)
		if err != nil {
			return nil, fmt.Errorf("%w: budgets %q: want percentages in (0, 100] separated by commas", errUsage, s)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseStorage parses a list of storage kinds: disk or a bandwidth.
func parseStorage(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "disk" {
			out = append(out, 0)
			continue
		}
		bw, err := parseBandwidth(p)
		if err != nil || bw == 0 {
			return nil, fmt.Errorf("%w: storage %q: want disk or bandwidths like 400MB/s", errUsage, p)
		}
		out = append(out, bw)
	}
	return out, nil
}

// specModes are the names --modes accepts, in bench.SpecModes' order.
var specModes = func() []string {
	var names []string
	for _, m := range bench.SpecModes(1, spec.Config{}) {
		names = append(names, strings.SplitN(m.Name, "(", 2)[0])
	}
	return names
}()

// checkSpecInputs checks, before any model is inflated or measured, that
// the draft shares the target's vocabulary and that every prompt id lies
// in it: both failed only after the target alone had been measured.
func checkSpecInputs(from, draft, promptsPath string, prompts [][]int32) error {
	vocab := func(path string) (int, error) {
		f, err := weights.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		cfg, err := model.ConfigFrom(f)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		return cfg.Vocab, nil
	}
	tv, err := vocab(from)
	if err != nil {
		return err
	}
	dv, err := vocab(draft)
	if err != nil {
		return err
	}
	if dv != tv {
		return fmt.Errorf("%w: --draft %s has a vocabulary of %d tokens and --from %s one of %d: a draft must share the target's vocabulary", errUsage, draft, dv, from, tv)
	}
	for i, p := range prompts {
		for _, id := range p {
			if id < 0 || int(id) >= tv {
				return fmt.Errorf("%w: --prompts %s: prompt %d has token %d, outside the vocabulary of %d", errUsage, promptsPath, i+1, id, tv)
			}
		}
	}
	return nil
}
