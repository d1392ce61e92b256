package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// SpecMode is one decoding mode of the speculative benchmark.
type SpecMode struct {
	Name string
	// Target-only modes stream the target with Stream (std or stdpl);
	// speculative ones stream it pipelined with Config.
	Speculative bool
	Stream      weights.StreamMode
	Config      spec.Config
}

// SpecModes are the modes `tandem bench spec` compares: the target alone
// (Std and StdPL), classic SD with draft length k, BiLD, the tree, and
// the tree's ablations (no pacer, no adaptive sizing, no pipeline).
// shape sets the tree's BranchThreshold, MaxBranches and MaxTree (zero
// fields take spec's defaults, as generate runs it); its other fields are
// ignored.
func SpecModes(sdLen int, shape spec.Config) []SpecMode {
	tree := func() spec.Config {
		return spec.Config{Method: spec.Tree, Pipeline: true,
			BranchThreshold: shape.BranchThreshold, MaxBranches: shape.MaxBranches, MaxTree: shape.MaxTree}
	}
	if shape.MaxTree == 0 {
		shape.MaxTree = spec.DefaultMaxTree
	}
	uniform, fixed, nopipe, llmcad := tree(), tree(), tree(), tree()
	uniform.Pacer = spec.UniformPacer{}
	fixed.Trigger = spec.FixedSize{N: shape.MaxTree}
	nopipe.Pipeline = false
	llmcad.Trigger = &spec.Adaptive{}
	return []SpecMode{
		{Name: "std", Stream: weights.StreamStd},
		{Name: "stdpl", Stream: weights.StreamPipelined},
		{Name: fmt.Sprintf("sd(k=%d)", sdLen), Speculative: true, Config: spec.Config{Method: spec.SD, DraftLen: sdLen}},
		{Name: "bild", Speculative: true, Config: spec.Config{Method: spec.BiLD, Pipeline: true}},
		{Name: "tree", Speculative: true, Config: tree()},
		{Name: "tree-uniform", Speculative: true, Config: uniform},
		{Name: "tree-fixed", Speculative: true, Config: fixed},
		{Name: "tree-adaptive", Speculative: true, Config: llmcad},
		{Name: "tree-nopipe", Speculative: true, Config: nopipe},
	}
}

// SpecConfig is one configuration of the speculative benchmark.
type SpecConfig struct {
	Target, Draft string // model files (same vocabulary)
	Mode          SpecMode
	Budget        uint64  // the target's weight budget in bytes
	Bandwidth     float64 // emulated storage bytes/s; 0 = the real disk
	DiskBW        float64 // the disk's measured cold bandwidth
	Threads       int
	Prompts       [][]int32 // run r decodes Prompt(r)
	// Runs runs of Tokens tokens are measured; the per-token latency is
	// the median over runs.
	Runs, Tokens int
}

// Prompt is the prompt run r decodes: the prompts in turn.
func (c SpecConfig) Prompt(r int) []int32 { return c.Prompts[r%len(c.Prompts)] }

// bandwidth is the storage bandwidth the target streams from: the
// emulated one, or the disk's as measured.
func (c SpecConfig) bandwidth() float64 {
	if c.Bandwidth > 0 {
		return c.Bandwidth
	}
	return c.DiskBW
}

// SpecResult is one configuration measured.
type SpecResult struct {
	Config     SpecConfig
	Type       string
	TotalBytes uint64          // the target's streamable weights
	Streamed   uint64          // target bytes read per pass, as planned
	Token      time.Duration   // median per-token latency
	RunTimes   []time.Duration // per-token latency of each run
	// PassBound is the IO lower bound of one target pass (Streamed ÷
	// bandwidth).
	PassBound time.Duration
	Passes    int // target passes over all runs
	Emitted   int // tokens over all runs
	Stats     spec.Stats
	Outputs   [][]int32 // per run, for the losslessness check
}

// TokensPerPass is the tokens emitted per target pass.
func (r SpecResult) TokensPerPass() float64 {
	if r.Passes == 0 {
		return 0
	}
	return float64(r.Emitted) / float64(r.Passes)
}

// Storage names the storage the target streamed from.
func (r SpecResult) Storage() string {
	if r.Config.Bandwidth > 0 {
		return fmt.Sprintf("%.0f MB/s", r.Config.Bandwidth/1e6)
	}
	return fmt.Sprintf("disk (%.0f MB/s)", r.Config.DiskBW/1e6)
}

// Spec measures one mode: the target is loaded streaming under the
// budget (page cache dropped first), the draft resident, and each run
// generates cfg.Tokens greedy tokens from a prompt. A run's latency is
// its time from the prompt to the last token ÷ tokens: the target alone
// makes one pass per token (the prefill's gives the first); a
// speculative run verifies its first tree in the pass over the prompt.
func Spec(cfg SpecConfig) (SpecResult, error) {
	cfg.Runs = cmp(cfg.Runs, 5)
	cfg.Tokens = cmp(cfg.Tokens, 32)
	res := SpecResult{Config: cfg}
	if len(cfg.Prompts) == 0 {
		return res, fmt.Errorf("bench: spec: no prompts")
	}
	if err := weights.DropPageCache(cfg.Target); err != nil {
		return res, err
	}
	tf, err := weights.Open(cfg.Target)
	if err != nil {
		return res, err
	}
	defer tf.Close()
	_, res.Type = WeightBytesPerToken(tf)
	pool := kernels.NewPool(cfg.Threads)
	defer pool.Close()
	sopt := weights.StreamOptions{Budget: cfg.Budget, Mode: cfg.Mode.Stream, Throttle: weights.Throttle{Bandwidth: cfg.Bandwidth}}
	if cfg.Mode.Speculative {
		sopt.Mode = weights.StreamPipelined
	}
	plan, groups, err := model.PlanStream(tf, sopt)
	if err != nil {
		return res, err
	}
	res.TotalBytes, res.Streamed = plan.Total, plan.Streamed(groups, tf)
	if bw := cfg.bandwidth(); bw > 0 {
		res.PassBound = time.Duration(float64(res.Streamed) / bw * float64(time.Second))
	}
	mopt := model.Options{Pool: pool, Stream: &sopt}
	var lane *spec.Lane
	if cfg.Mode.Speculative {
		lane = spec.NewLane()
		mopt.Lane = lane
	}
	target, err := model.Load(tf, mopt)
	if err != nil {
		return res, err
	}
	defer target.Close()
	ctx := min(target.Config().Context, 256)
	sc := cfg.Mode.Config
	sc.Lane = lane
	tree := 0
	if cfg.Mode.Speculative {
		tree = sc.TreeRows()
	}
	tcache, err := target.NewTreeCache(ctx, tree, weights.F32)
	if err != nil {
		return res, err
	}

	var dec *spec.Decoder
	if cfg.Mode.Speculative {
		df, err := weights.Open(cfg.Draft)
		if err != nil {
			return res, err
		}
		defer df.Close()
		draft, err := model.Load(df, model.Options{Pool: pool})
		if err != nil {
			return res, err
		}
		defer draft.Close()
		dcache, err := draft.NewTreeCache(min(ctx, draft.Config().Context), sc.TreeRows(), weights.F32)
		if err != nil {
			return res, err
		}
		if dec, err = spec.New(draft, target, dcache, tcache, nil, sc); err != nil {
			return res, err
		}
	}
	var secs []float64
	for r := 0; r < cfg.Runs; r++ {
		out, d, passes, err := specRun(target, tcache, dec, cfg.Prompt(r), cfg.Tokens)
		if err != nil {
			return res, fmt.Errorf("bench: spec %s run %d: %w", cfg.Mode.Name, r, err)
		}
		per := d / time.Duration(len(out))
		res.RunTimes = append(res.RunTimes, per)
		secs = append(secs, per.Seconds())
		res.Outputs = append(res.Outputs, out)
		res.Passes += passes
		res.Emitted += len(out)
	}
	res.Token = time.Duration(Median(secs) * float64(time.Second))
	if dec != nil {
		// Emitted stays the tokens the runs kept: a run's last pass may
		// accept more than it asked for, which the decoder's count holds
		// (with --tokens 1 it read 7 tokens a pass).
		res.Stats = dec.Stats()
		res.Passes = res.Stats.TargetPasses
	}
	return res, nil
}

// specRun generates n tokens (no stop token) and returns them, the time
// from the prompt to the last of them and the target passes the target
// alone took (one per token: the prefill's pass gives the first).
func specRun(target *model.Model, tcache *kv.Cache, dec *spec.Decoder, prompt []int32, n int) ([]int32, time.Duration, int, error) {
	ctx := context.Background()
	opt := spec.GenOptions{MaxTokens: n}
	if dec == nil {
		res, err := spec.Generate(ctx, target, tcache, prompt, opt)
		if err != nil {
			return nil, 0, 0, err
		}
		return res.Ids, res.PromptEval + res.Decode, len(res.Ids), nil
	}
	res, err := spec.Speculate(ctx, dec, prompt, opt)
	if err != nil {
		return nil, 0, 0, err
	}
	return res.Ids, res.PromptEval + res.Decode, 0, nil
}

// SpecReference is the target alone's greedy tokens for each run of cfg
// (cfg.Tokens each), its weights read in place: what every lossless
// mode must emit, over all the tokens it emits. The timed target-alone
// modes generate fewer tokens (each costs a streamed pass), so they
// cannot be that reference.
func SpecReference(cfg SpecConfig) ([][]int32, error) {
	if len(cfg.Prompts) == 0 {
		return nil, fmt.Errorf("bench: spec: no prompts")
	}
	tf, err := weights.Open(cfg.Target)
	if err != nil {
		return nil, err
	}
	defer tf.Close()
	pool := kernels.NewPool(cfg.Threads)
	defer pool.Close()
	target, err := model.Load(tf, model.Options{Pool: pool})
	if err != nil {
		return nil, err
	}
	defer target.Close()
	tcache, err := target.NewTreeCache(min(target.Config().Context, 256), 0, weights.F32)
	if err != nil {
		return nil, err
	}
	runs := cmp(cfg.Runs, 5)
	outs := make([][]int32, runs)
	for r := range runs {
		if r >= len(cfg.Prompts) { // the prompts in turn: a run repeats an earlier one
			outs[r] = outs[r%len(cfg.Prompts)]
			continue
		}
		if outs[r], _, _, err = specRun(target, tcache, nil, cfg.Prompt(r), cmp(cfg.Tokens, 32)); err != nil {
			return nil, fmt.Errorf("bench: spec reference run %d: %w", r, err)
		}
	}
	return outs, nil
}

// SpecTable formats results with their speedups over std and over the
// best SD measured in the same storage and budget, and each mode's
// agreement with ref (SpecReference).
func SpecTable(rs []SpecResult, ref [][]int32) string {
	var sb strings.Builder
	sb.WriteString("| type | storage | budget | mode | ms/token | tokens/pass | acceptance | mean tree | pass IO bound ms | vs std | vs sd | agreement |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		std, sd := peers(rs, r)
		speed := func(p *SpecResult) string {
			if p == nil || r.Token <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2fx", p.Token.Seconds()/r.Token.Seconds())
		}
		acc, tree := "-", "-"
		if r.Config.Mode.Speculative {
			acc = fmt.Sprintf("%.2f", r.Stats.AcceptanceRate())
			tree = fmt.Sprintf("%.1f", float64(r.Stats.Verified)/float64(max(1, r.Stats.TargetPasses)))
		}
		agree := fmt.Sprintf("%.3f", Agreement(r.Outputs, ref))
		fmt.Fprintf(&sb, "| %s | %s | %.0f%% | %s | %.0f | %.2f | %s | %s | %.0f | %s | %s | %s |\n",
			r.Type, r.Storage(), 100*float64(r.Config.Budget)/float64(r.TotalBytes), r.Config.Mode.Name, ms(r.Token),
			r.TokensPerPass(), acc, tree, ms(r.PassBound), speed(std), speed(sd), agree)
	}
	return sb.String()
}

// peers finds, for r's storage and budget, the std result and the fastest
// SD result.
func peers(rs []SpecResult, r SpecResult) (std, sd *SpecResult) {
	for i := range rs {
		p := &rs[i]
		if p.Type != r.Type || p.Config.Bandwidth != r.Config.Bandwidth || p.Config.Budget != r.Config.Budget {
			continue
		}
		switch {
		case p.Config.Mode.Name == "std":
			std = p
		case strings.HasPrefix(p.Config.Mode.Name, "sd("):
			if sd == nil || p.Token < sd.Token {
				sd = p
			}
		}
	}
	return std, sd
}

// Agreement is the share of tokens equal to the reference's, position by
// position over every token got holds (1 for a lossless mode; BiLD's is
// measured). A token past the reference's end counts as a difference.
func Agreement(got, want [][]int32) float64 {
	var same, all int
	for i, g := range got {
		all += len(g)
		if i >= len(want) {
			continue
		}
		for j := range min(len(g), len(want[i])) {
			if g[j] == want[i][j] {
				same++
			}
		}
	}
	if all == 0 {
		return 0
	}
	return float64(same) / float64(all)
}

// Lossless reports the first lossless mode (all but bild) that emitted a
// token other than the target alone's (ref, from SpecReference), in any
// run at any position.
func Lossless(rs []SpecResult, ref [][]int32) error {
	for _, r := range rs {
		if r.Config.Mode.Name == "bild" {
			continue
		}
		for i, out := range r.Outputs {
			if i >= len(ref) || len(out) > len(ref[i]) || !slices.Equal(out, ref[i][:len(out)]) {
				var want []int32
				if i < len(ref) {
					want = ref[i]
				}
				return fmt.Errorf("bench: %s (%s, %s) run %d emitted %v, the target alone %v", r.Config.Mode.Name, r.Type, r.Storage(), i, out, want)
			}
		}
	}
	return nil
}

// AcceptanceCurve is, for each depth d, the share of verifications that
// accepted at least d drafted tokens.
func AcceptanceCurve(st spec.Stats) []float64 {
	total := 0
	for _, c := range st.AcceptLen {
		total += c
	}
	out := make([]float64, len(st.AcceptLen))
	at := total
	for d, c := range st.AcceptLen {
		if total > 0 {
			out[d] = float64(at) / float64(total)
		}
		at -= c
	}
	return out
}

// VerifyCost measures one target pass over a tree of n tokens (a chain
// under the prompt) for each n, streamed as cfg says: the verification
// cost curve t_v(n) that sizes the tree. Each figure is the median of
// cfg.Runs passes.
func VerifyCost(cfg SpecConfig, sizes []int) ([]time.Duration, error) {
	cfg.Runs = cmp(cfg.Runs, 3)
	tf, err := weights.Open(cfg.Target)
	if err != nil {
		return nil, err
	}
	defer tf.Close()
	if err := weights.DropPageCache(cfg.Target); err != nil {
		return nil, err
	}
	sopt := weights.StreamOptions{Budget: cfg.Budget, Mode: weights.StreamPipelined, Throttle: weights.Throttle{Bandwidth: cfg.Bandwidth}}
	m, err := model.Load(tf, model.Options{Threads: cfg.Threads, Stream: &sopt})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	cache, err := m.NewCache(min(m.Config().Context, 256), weights.F32)
	if err != nil {
		return nil, err
	}
	seq, err := cache.NewSeq()
	if err != nil {
		return nil, err
	}
	var b model.Batch
	var out model.Logits
	prompt := cfg.Prompts[0]
	b.Chain(prompt, 0, seq, -1, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		return nil, err
	}
	cache.CommitAll(seq)
	var costs []time.Duration
	for _, n := range sizes {
		var secs []float64
		for r := 0; r < cfg.Runs; r++ {
			b.Reset()
			for i := range n {
				b.Add(int32(1+i%100), int32(len(prompt)+i), seq, i-1, true)
			}
			start := time.Now()
			if err := m.Forward(&b, cache, &out); err != nil {
				return nil, err
			}
			secs = append(secs, time.Since(start).Seconds())
			cache.Drop(seq)
		}
		costs = append(costs, time.Duration(Median(secs)*float64(time.Second)))
	}
	return costs, nil
}

// SpecPlot draws per-token latency per mode against storage bandwidth for
// one type and budget: a line per mode, or with a single storage a bar per
// mode (labelled with its tokens per target pass).
func SpecPlot(rs []SpecResult, title string) []byte {
	storages := map[float64]bool{}
	for _, r := range rs {
		storages[r.Config.bandwidth()] = true
	}
	if len(storages) == 1 {
		c := BarChart{Title: title, XLabel: "ms per token (median)"}
		for _, r := range rs {
			c.Bars = append(c.Bars, Bar{Name: r.Config.Mode.Name, Value: ms(r.Token),
				Label: fmt.Sprintf("%.0f ms, %.2f tokens/pass", ms(r.Token), r.TokensPerPass())})
		}
		return c.SVG()
	}
	c := Chart{Title: title, XLabel: "storage bandwidth (MB/s)", YLabel: "ms per token (median)", YFromZero: true}
	lines := map[string]*Series{}
	var order []string
	for _, r := range rs {
		bw := r.Config.bandwidth()
		name := r.Config.Mode.Name
		s, ok := lines[name]
		if !ok {
			s = &Series{Name: name, Dashed: strings.HasPrefix(name, "tree-")}
			lines[name] = s
			order = append(order, name)
		}
		s.X, s.Y = append(s.X, bw/1e6), append(s.Y, ms(r.Token))
	}
	for _, n := range order {
		c.Series = append(c.Series, *lines[n])
	}
	return c.SVG()
}
