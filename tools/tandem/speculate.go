package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// specFlags are the draft model and the speculative decoder's tuning.
type specFlags struct {
	draft, draftTok      *string
	threshold            *float64
	maxTree, maxBranches *int
	draftBatch, draftLen *int
	trigger, pacer       *string
	alpha                *float64
	noPipeline, noPause  *bool
	fallback, rollback   *float64
	draftCtx             *int
}

func addSpecFlags(fs *flag.FlagSet) *specFlags {
	return &specFlags{
		draft:       fs.String("draft", "", "draft model (GGUF or llama2.c .bin) sharing the model's tokenizer: speculative decoding (--mode tree by default)"),
		draftTok:    fs.String("draft-tokenizer", "", "the draft's tokenizer.bin or GGUF vocabulary (default: the draft's own, else --tokenizer)"),
		threshold:   fs.Float64("branch-threshold", spec.DefaultBranchThreshold, "tree: every candidate above this draft probability opens a branch"),
		maxTree:     fs.Int("max-tree", spec.DefaultMaxTree, "tree: most drafted tokens per verification (also the pacer's draft budget)"),
		maxBranches: fs.Int("max-branches", spec.DefaultMaxBranches, "tree: most branches open at once"),
		draftBatch:  fs.Int("draft-batch", spec.DefaultDraftBatch, "tree: branches extended per draft step (one batched draft pass)"),
		trigger:     fs.String("trigger", "cost", "tree: when to verify: cost (size the tree from measured verification and draft costs), adaptive (LLMCad's confidence threshold alpha), fixed (at --max-tree tokens)"),
		alpha:       fs.Float64("alpha", spec.DefaultAlpha, "tree with --trigger adaptive: the starting confidence threshold"),
		pacer:       fs.String("pacer", "fair", "tree: which branch grows next: fair (max-min share by confidence), uniform (shortest branch first)"),
		noPipeline:  fs.Bool("no-pipeline", false, "tree and sd: do not draft while a streamed model waits on IO"),
		noPause:     fs.Bool("no-pause", false, "tree with --trigger cost: draft every round, even while drafted rounds emit fewer tokens a second than the model alone"),
		draftLen:    fs.Int("draft-len", spec.DefaultDraftLen, "sd: draft tokens per verification"),
		draftCtx:    fs.Int("draft-ctx", 0, "the draft's KV positions per sequence (0: its own context, at most --ctx); past them it drafts from its latest tokens, so a smaller one saves memory for weaker guesses; the output is the model's either way"),
		fallback:    fs.Float64("fallback", 0.5, "bild: the draft hands over when its top probability falls below this"),
		rollback:    fs.Float64("rollback", 2, "bild: roll back a draft token whose cross-entropy under the model exceeds this"),
	}
}

// wanted reports whether generation speculates: with --draft, or with the
// embedded default target (which has its draft embedded beside it) unless
// --mode asks for the target alone.
func (sf *specFlags) wanted(modelPath, mode string) bool {
	if *sf.draft != "" || modelPath != "" {
		return *sf.draft != ""
	}
	for _, m := range runModes {
		if m.name == mode {
			return m.speculative
		}
	}
	return true
}

// specFlagMethods are the speculative methods each tuning flag of
// specFlags applies to. A flag given for a run that does not use it was
// silently ignored (--draft-len without --draft, --max-tree with --mode
// sd); specFlags.check refuses it instead.
var specFlagMethods = map[string][]spec.Method{
	"branch-threshold": {spec.Tree}, "max-tree": {spec.Tree}, "max-branches": {spec.Tree}, "draft-batch": {spec.Tree},
	"trigger": {spec.Tree}, "alpha": {spec.Tree}, "pacer": {spec.Tree}, "no-pause": {spec.Tree},
	"no-pipeline": {spec.Tree, spec.SD}, "draft-len": {spec.SD}, "fallback": {spec.BiLD}, "rollback": {spec.BiLD},
	"draft-ctx": {spec.Tree, spec.SD, spec.BiLD}, "draft-tokenizer": {spec.Tree, spec.SD, spec.BiLD},
}

// check refuses a tuning flag the run's decoding would ignore:
// mode is the decoding's name (tree, sd, bild; target, resident, std or
// stdpl for the model alone), method its method when speculative.
func (sf *specFlags) check(fs *flag.FlagSet, speculative bool, method spec.Method, mode string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		methods, ok := specFlagMethods[f.Name]
		switch {
		case !ok || err != nil:
		case !speculative:
			err = fmt.Errorf("%w: --%s tunes speculative decoding, and this run decodes with the model alone (%s): add --draft FILE, or leave it out", errUsage, f.Name, mode)
		case !slices.Contains(methods, method):
			var names []string
			for _, m := range methods {
				names = append(names, strings.ToLower(m.String()))
			}
			err = fmt.Errorf("%w: --%s applies to --mode %s, not %s", errUsage, f.Name, strings.Join(names, " or "), mode)
		case f.Name == "alpha" && *sf.trigger != "adaptive":
			err = fmt.Errorf("%w: --alpha is the adaptive trigger's threshold: add --trigger adaptive (the trigger is %s)", errUsage, *sf.trigger)
		case f.Name == "no-pause" && *sf.trigger != "cost":
			err = fmt.Errorf("%w: --no-pause applies to --trigger cost, which pauses drafting; the trigger is %s", errUsage, *sf.trigger)
		}
	})
	return err
}

// maxTreeSize bounds --max-tree, --max-branches, --draft-batch and
// --draft-len: the target verifies a tree in one pass of that many tokens.
const maxTreeSize = 4096

// config turns the flags into a decoder configuration for method.
func (sf *specFlags) config(method spec.Method, lane *spec.Lane) (spec.Config, error) {
	cfg := spec.Config{Method: method, BranchThreshold: *sf.threshold, MaxTree: *sf.maxTree, MaxBranches: *sf.maxBranches,
		DraftBatch: *sf.draftBatch, DraftLen: *sf.draftLen, Fallback: *sf.fallback, Rollback: *sf.rollback,
		Pipeline: lane != nil && !*sf.noPipeline, Lane: lane}
	// The checks are written so that NaN fails them too.
	if !(cfg.BranchThreshold > 0 && cfg.BranchThreshold <= 1) {
		return cfg, fmt.Errorf("%w: --branch-threshold %g: want a probability in (0, 1]", errUsage, cfg.BranchThreshold)
	}
	for name, v := range map[string]int{"--max-tree": cfg.MaxTree, "--max-branches": cfg.MaxBranches, "--draft-batch": cfg.DraftBatch, "--draft-len": cfg.DraftLen} {
		// The top is far past any useful tree; 100000000 failed later,
		// asking to lower the context.
		if v < 1 || v > maxTreeSize {
			return cfg, fmt.Errorf("%w: %s %d: want 1 to %d", errUsage, name, v, maxTreeSize)
		}
	}
	if !(cfg.Fallback >= 0 && cfg.Fallback <= 1) {
		return cfg, fmt.Errorf("%w: --fallback %g: want a probability in [0, 1]", errUsage, cfg.Fallback)
	}
	if !(cfg.Rollback >= 0) || math.IsInf(cfg.Rollback, 0) {
		return cfg, fmt.Errorf("%w: --rollback %g: want a cross-entropy of 0 or more (in nats)", errUsage, cfg.Rollback)
	}
	if err := spec.CheckDraftContext(*sf.draftCtx); err != nil {
		return cfg, fmt.Errorf("%w: --draft-ctx %w", errUsage, err)
	}
	switch *sf.trigger {
	case "cost":
		cfg.Trigger = &spec.CostAware{NoPause: *sf.noPause}
	case "adaptive":
		if !(*sf.alpha > 0 && *sf.alpha <= 1) {
			return cfg, fmt.Errorf("%w: --alpha %g: want a confidence in (0, 1]", errUsage, *sf.alpha)
		}
		cfg.Trigger = &spec.Adaptive{Alpha: *sf.alpha}
	case "fixed":
		cfg.Trigger = spec.FixedSize{N: cfg.MaxTree}
	default:
		return cfg, fmt.Errorf("%w: --trigger %q: want cost, adaptive or fixed", errUsage, *sf.trigger)
	}
	switch *sf.pacer {
	case "fair":
		cfg.Pacer = spec.FairPacer{}
	case "uniform":
		cfg.Pacer = spec.UniformPacer{}
	default:
		return cfg, fmt.Errorf("%w: --pacer %q: want fair or uniform", errUsage, *sf.pacer)
	}
	if method != spec.Tree {
		cfg.Trigger, cfg.Pacer = nil, nil // SD and BiLD use their own
	}
	return cfg, nil
}

// draftPair is a loaded draft with the decoder that pairs it with the
// target.
type draftPair struct {
	file    *weights.File
	model   *model.Model
	decoder *spec.Decoder
}

func (p *draftPair) Close() {
	p.model.Close()
	p.file.Close()
}

// openDraft loads the draft, refuses it unless it shares the target's
// vocabulary, and makes the decoder. The draft shares the target's kernel
// pool: the two never compute at once.
func (sf *specFlags) openDraft(target *model.Model, targetTok *tokenizer.Tokenizer, targetCache *kv.Cache, tokPath string,
	cfg spec.Config, pool *kernels.Pool, sampler *sample.Sampler, kvt weights.DType, stderr io.Writer) (*draftPair, error) {
	f, err := sf.openDraftFile(targetTok, target.File().Path, tokPath)
	if err != nil {
		return nil, err
	}
	p := &draftPair{file: f}
	fail := func(err error) (*draftPair, error) {
		if p.model != nil {
			p.model.Close()
		}
		f.Close()
		return nil, err
	}
	if p.model, err = model.Load(f, model.Options{Pool: pool}); err != nil {
		return fail(err)
	}
	ctx := min(targetCache.Config().Context, p.model.Config().Context)
	if n := *sf.draftCtx; n > 0 { // checked by config
		ctx = min(ctx, n)
	}
	dcache, err := p.model.NewTreeCache(ctx, cfg.TreeRows(), kvt)
	if err != nil {
		return fail(err)
	}
	if p.decoder, err = spec.New(p.model, target, dcache, targetCache, sampler, cfg); err != nil {
		return fail(err)
	}
	for _, n := range p.decoder.Notes() {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	return p, nil
}

// openDraftFile opens --draft (the embedded draft when it is empty) and
// refuses it unless its vocabulary is the target's (targetName says where
// that came from): its tokenizer is --draft-tokenizer, else the draft's
// own, else the target's file tokPath. Every verb that speculates loads
// its draft here.
func (sf *specFlags) openDraftFile(targetTok *tokenizer.Tokenizer, targetName, tokPath string) (*weights.File, error) {
	var f *weights.File
	var err error
	if *sf.draft == "" {
		f, err = defaultmodel.Draft()
	} else if f, err = weights.Open(*sf.draft); err != nil {
		err = fmt.Errorf("--draft: %w", err)
	}
	if err != nil {
		return nil, err
	}
	if err := spec.CheckDraftFile(f, *sf.draftTok, tokPath, targetTok, targetName); err != nil {
		f.Close()
		switch {
		case errors.Is(err, tokenizer.ErrNoVocabulary):
			return nil, fmt.Errorf("%w: --draft: %v: pass --draft-tokenizer", errUsage, err)
		case errors.Is(err, tokenizer.ErrWrongVocabulary):
			return nil, fmt.Errorf("%w: --draft: %v; pass the draft's own with --draft-tokenizer", errUsage, err)
		case errors.Is(err, spec.ErrVocab):
			return nil, err
		}
		return nil, fmt.Errorf("--draft: %w", err)
	}
	return f, nil
}

// specStats are the speculative figures generate reports.
type specStats struct {
	Mode           string  `json:"mode"`
	Draft          string  `json:"draft"`
	TargetPasses   int     `json:"target_passes"`
	DraftSteps     int     `json:"draft_steps"`
	TokensPerPass  float64 `json:"tokens_per_target_pass"`
	AcceptanceRate float64 `json:"acceptance_rate"`
	DraftTokens    int     `json:"draft_tokens_verified"`
	Accepted       int     `json:"draft_tokens_accepted"`
	MeanTree       float64 `json:"mean_tree_size"`
	MaxTree        int     `json:"max_tree_size"`
	Undrafted      int     `json:"undrafted_passes"`
	Slides         int     `json:"draft_window_slides"`
	PipelineSteps  int     `json:"pipeline_draft_steps"`
	KeptTokens     int     `json:"pipeline_tokens_kept"`
	Filled         int     `json:"free_row_tokens_verified"`
	FilledAccepted int     `json:"free_row_tokens_accepted"`
	DraftSeconds   float64 `json:"draft_seconds"`
	TargetSeconds  float64 `json:"target_seconds"`
	IOWaitSeconds  float64 `json:"io_wait_seconds"`
}

func newSpecStats(st spec.Stats, draft string) *specStats {
	s := &specStats{Mode: st.Method, Draft: draft, TargetPasses: st.TargetPasses, DraftSteps: st.DraftSteps,
		TokensPerPass: st.TokensPerPass(), AcceptanceRate: st.AcceptanceRate(), DraftTokens: st.Verified, Accepted: st.Accepted,
		MaxTree: st.MaxTree, Undrafted: st.Undrafted, Slides: st.Slides, PipelineSteps: st.PipelineSteps, KeptTokens: st.KeptNodes,
		Filled: st.Filled, FilledAccepted: st.FilledAccepted,
		DraftSeconds: st.DraftTime.Seconds(), TargetSeconds: st.TargetTime.Seconds(), IOWaitSeconds: st.IOWait.Seconds()}
	if st.TargetPasses > 0 {
		s.MeanTree = float64(st.Verified) / float64(st.TargetPasses)
	}
	return s
}

func (s *specStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %.2f tokens per target pass (%d passes), acceptance %.2f, tree %.1f mean / %d max, %d draft steps",
		s.Mode, s.TokensPerPass, s.TargetPasses, s.AcceptanceRate, s.MeanTree, s.MaxTree, s.DraftSteps)
	if s.PipelineSteps > 0 {
		fmt.Fprintf(&b, " (%d during IO, %d tokens kept)", s.PipelineSteps, s.KeptTokens)
	}
	if s.Filled > 0 {
		fmt.Fprintf(&b, ", %d tokens in free rows (%d accepted)", s.Filled, s.FilledAccepted)
	}
	if s.Undrafted > 0 {
		passes := "passes"
		if s.Undrafted == 1 {
			passes = "pass"
		}
		fmt.Fprintf(&b, ", %d %s over the root alone (drafting paused while it did not pay; --no-pause drafts always)", s.Undrafted, passes)
	}
	if s.Slides > 0 {
		fmt.Fprintf(&b, ", the draft's window slid %d× (its context is shorter than the target's)", s.Slides)
	}
	fmt.Fprintf(&b, " | time: draft %s, target %s (IO wait %s)", secs(s.DraftSeconds), secs(s.TargetSeconds), secs(s.IOWaitSeconds))
	return b.String()
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}
