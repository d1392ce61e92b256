package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// defaultModelName is the embedded default's Path.
const defaultModelName = defaultmodel.TargetName

func runGenerate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("generate", "[--model FILE] [--tokenizer FILE] [--prompt TEXT] [flags]",
		"Generates text, streaming it to stdout as tokens arrive; statistics go to\n"+
			"stderr. The model is a GGUF or a llama2.c .bin (which needs --tokenizer); with\n"+
			"no --model tandem's own pair runs: a 2.6M-parameter story model with its\n"+
			"0.4M-parameter draft, speculating in a tree (--mode target: the model alone).\n"+
			"Generation stops at EOS, at BOS (llama2.c models end a\n"+
			"story with it), at --max-tokens or when the context is full.\n"+
			"With --budget the weights beyond the budget stream from the file each token,\n"+
			"layer by layer (the page cache is dropped behind them, so the budget is real);\n"+
			"the output is the same as with the whole model in memory. On a GPU\n"+
			"(--device cuda) the budget is still host RAM: the layers it pins stay in GPU\n"+
			"memory, the others pass through two GPU slots of the largest layer's size,\n"+
			"one copying while the other computes (see README, \"CUDA\").\n"+
			"With --draft a small draft model guesses a tree of tokens that the model checks\n"+
			"in one pass (--mode tree, sd or bild); tree and sd emit exactly the model's own\n"+
			"tokens (greedy) or its distribution (sampling), only faster.", stdout, stderr,
		`tandem generate --prompt "Once upon a time"`,
		`tandem generate --model stories260K.bin --tokenizer tok512.bin --prompt "Once upon a time" --max-tokens 100`,
		`tandem generate --model model.gguf --temperature 0.8 --top-p 0.95 --seed 42 --json`,
		`tandem generate --model target.gguf --budget 256MiB --io-bandwidth 400MB/s   # stream under a budget from emulated eMMC`,
		`tandem generate --model target.gguf --budget min --mode std`,
		`tandem generate --model target.gguf --device cuda --budget 2GiB   # stream through an NVIDIA GPU (-tags cuda build)`,
		`tandem generate --model stories260K.bin --draft llama2xs_model.bin --tokenizer tok512.bin --json   # speculative decoding`,
		`tandem generate --model target.gguf --draft draft.gguf --budget 25% --io-bandwidth 400MB/s --mode tree`)
	modelPath := fs.String("model", "", "model file (default: the embedded model)")
	tokPath := fs.String("tokenizer", "", "tokenizer.bin or GGUF vocabulary (default: the model's own)")
	prompt := fs.String("prompt", "Once upon a time", "prompt text")
	maxTokens := fs.Int("max-tokens", 128, "most tokens to generate (0: until EOS or the context is full)")
	temp := fs.Float64("temperature", 0, "sampling temperature; 0 is greedy (deterministic)")
	topP := fs.Float64("top-p", 0, "nucleus sampling mass (0: off)")
	topK := fs.Int("top-k", 0, "keep only the K most likely tokens (0: off)")
	minP := fs.Float64("min-p", 0, "drop tokens below this fraction of the top probability (0: off)")
	repeat := fs.Float64("repeat-penalty", 1, "penalty for tokens already in the context (1: off)")
	seed := fs.Uint64("seed", 0, "sampling seed: same seed, same text, in every mode (bild aside) the text the model alone draws with it")
	threads := threadsFlag(fs)
	ctxLen := fs.Int("ctx", 0, "context length (0: the model's)")
	kvType := fs.String("kv-type", "f32", "KV cache type: f32 or f16")
	backend := fs.String("kernels", "", "kernel backend: c or go (default: fastest compiled in)")
	device := fs.String("device", "cpu", "where the model computes: cpu, or cuda / cuda:N for an NVIDIA GPU (a binary built with -tags cuda; see README, \"CUDA\")")
	asJSON := fs.Bool("json", false, `print one JSON object {"prompt_ids","ids","text","stats"} instead of streaming`)
	rf := addRunFlags(fs)
	sf := addSpecFlags(fs)
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	sampling, err := checkSampling(*maxTokens, *temp, *topP, *topK, *minP, *repeat)
	if err != nil {
		return err
	}
	sampling.Seed = *seed
	if err := checkGreedyFlags(fs, *temp); err != nil {
		return err
	}
	if !utf8.ValidString(*prompt) {
		return fmt.Errorf("%w: --prompt is not valid UTF-8 (a shell in another encoding?)", errUsage)
	}
	if _, err := sf.config(spec.Tree, nil); err != nil { // the speculative flags, with or without a draft
		return err
	}
	if *backend != "" {
		if err := kernels.SetBackend(*backend); err != nil {
			return fmt.Errorf("%w: --kernels: %v", errUsage, err)
		}
	}
	kvt, err := weights.ParseDType(*kvType)
	if err != nil || (kvt != weights.F32 && kvt != weights.F16) {
		return fmt.Errorf("%w: --kv-type %q: want f32 or f16", errUsage, *kvType)
	}
	if _, _, err := model.ParseDevice(*device); err != nil {
		return fmt.Errorf("%w: --device: %v", errUsage, err)
	}
	if *ctxLen < 0 {
		return fmt.Errorf("%w: --ctx %d: want 0 (the model's) or more", errUsage, *ctxLen)
	}

	f, err := openModel(*modelPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tok, err := loadTokenizer(f, *tokPath, stderr)
	if err != nil {
		return err
	}
	rc, err := rf.resolve(f, sf.wanted(*modelPath, *rf.mode), stderr)
	if err != nil {
		return err
	}
	if err := sf.check(fs, rc.mode.speculative, rc.mode.method, rc.mode.name); err != nil {
		return err
	}
	pool := kernels.NewPool(*threads)
	defer pool.Close()
	mopt := model.Options{Pool: pool, Stream: rc.stream, Device: *device}
	var lane *spec.Lane
	if rc.mode.speculative && rc.stream != nil {
		lane = spec.NewLane() // the draft computes while the model waits on IO
		mopt.Lane = lane
	}
	m, err := model.Load(f, mopt)
	if err != nil {
		return err
	}
	defer m.Close()
	var scfg spec.Config
	tree := 0 // rows past the context for the draft's token tree
	if rc.mode.speculative {
		if scfg, err = sf.config(rc.mode.method, lane); err != nil {
			return err
		}
		tree = scfg.TreeRows()
	}
	if *ctxLen > m.Config().Context {
		return fmt.Errorf("%w: --ctx %d: the model takes at most %d", errUsage, *ctxLen, m.Config().Context)
	}
	cache, err := m.NewTreeCache(*ctxLen, tree, kvt)
	if err != nil {
		return err
	}
	ids, err := tok.Encode(*prompt, tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		return fmt.Errorf("prompt: %w", err)
	}
	// Said before the prompt is echoed, with what to change.
	if limit := min(m.Config().Context, cache.Config().Context); len(ids) > limit {
		hint := "shorten the prompt"
		if limit < m.Config().Context {
			hint += fmt.Sprintf(" or raise --ctx (the model takes up to %d)", m.Config().Context)
		}
		return fmt.Errorf("%w: the prompt has %d tokens and the context holds %d: %s", errUsage, len(ids), limit, hint)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dec := tok.NewDecoder()
	for _, id := range ids {
		dec.Next(id) // prime the decoder so the first generated piece renders right
	}
	opt := spec.GenOptions{
		MaxTokens: *maxTokens,
		Sampler:   sample.New(sampling),
		Stop:      func(id int32) bool { return id == tok.EOS() || id == tok.BOS() },
	}
	generate := func() (spec.Result, error) { return spec.Generate(ctx, m, cache, ids, opt) }
	var pair *draftPair
	if rc.mode.speculative {
		if pair, err = sf.openDraft(m, tok, cache, *tokPath, scfg, pool, opt.Sampler, kvt, stderr); err != nil {
			return err
		}
		defer pair.Close()
		generate = func() (spec.Result, error) { return spec.Speculate(ctx, pair.decoder, ids, opt) }
	}
	if !*asJSON {
		fmt.Fprint(stdout, *prompt)
		opt.OnToken = func(id int32) error {
			_, err := io.WriteString(stdout, dec.Next(id))
			return err
		}
	}
	// The first token's time is what a user waits for: with a draft the
	// prompt's last chunk is verified with the first tree, so the
	// prefill's figure alone does not say it.
	var start time.Time
	var firstToken time.Duration
	onToken := opt.OnToken
	opt.OnToken = func(id int32) error {
		if firstToken == 0 {
			firstToken = time.Since(start)
		}
		if onToken != nil {
			return onToken(id)
		}
		return nil
	}
	start = time.Now()
	res, err := generate()
	if err != nil {
		if ctx.Err() != nil && !*asJSON {
			fmt.Fprintln(stdout, dec.Flush()) // end the text's line before the note
		}
		return err
	}
	wall := time.Since(start)
	gen := res.Ids
	if res.Reason == spec.StopToken {
		gen = gen[:len(gen)-1] // the stop id is not text
	}
	// The text continues the prompt, as the stream and the server's
	// answers do: its first piece keeps its leading space.
	text := tok.DecodeAfter(ids, gen)
	st := stats{
		Model:          f.Path,
		PromptTokens:   len(ids),
		Generated:      len(gen),
		StopReason:     res.Reason.String(),
		PrefillSeconds: res.PromptEval.Seconds(),
		DecodeSeconds:  res.Decode.Seconds(),
		FirstToken:     firstToken.Seconds(),
		PrefillTokPerS: perSecond(len(ids), res.PromptEval),
		DecodeTokPerS:  perSecond(len(res.Ids)-1, res.Decode),
		WallSeconds:    wall.Seconds(),
		Threads:        m.Pool().Threads(),
		Kernels:        kernels.Backend(),
		PeakRSSBytes:   peakRSS(),
	}
	if sst, ok := m.StreamStats(); ok {
		st.Stream = newStreamStats(sst, rc.stream)
	}
	if pair != nil {
		ds := pair.decoder.Stats()
		// The last pass may accept tokens past --max-tokens, which are not
		// output: tokens per pass count what was generated.
		ds.Emitted = min(ds.Emitted, len(res.Ids))
		st.Spec = newSpecStats(ds, pair.file.Path)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(map[string]any{"prompt_ids": nonNil(ids), "ids": nonNil(gen), "text": text, "stats": st})
	}
	fmt.Fprintln(stdout, dec.Flush())
	fmt.Fprintf(stderr, "\nprompt %d tokens, %.1f tok/s | first token after %.0f ms | generated %d tokens, %.1f tok/s (%s) | %d threads, %s kernels | peak RSS %.1f MiB\n",
		st.PromptTokens, st.PrefillTokPerS, st.FirstToken*1e3, st.Generated, st.DecodeTokPerS, st.StopReason, st.Threads, st.Kernels, float64(st.PeakRSSBytes)/(1<<20))
	if st.Stream != nil {
		fmt.Fprintf(stderr, "stream %s\n", st.Stream)
	}
	if st.Spec != nil {
		fmt.Fprintf(stderr, "speculative %s\n", st.Spec)
	}
	return nil
}

type stats struct {
	Model          string  `json:"model"`
	PromptTokens   int     `json:"prompt_tokens"`
	Generated      int     `json:"generated_tokens"`
	StopReason     string  `json:"stop_reason"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	DecodeSeconds  float64 `json:"decode_seconds"`
	// FirstToken is the time from the start to the first generated
	// token (0 when none came before a stop).
	FirstToken     float64 `json:"first_token_seconds"`
	PrefillTokPerS float64 `json:"prefill_tok_per_s"`
	DecodeTokPerS  float64 `json:"decode_tok_per_s"`
	WallSeconds    float64 `json:"wall_seconds"`
	Threads        int     `json:"threads"`
	Kernels        string  `json:"kernels"`
	PeakRSSBytes   int64   `json:"peak_rss_bytes"`
	// Stream is set when the weights streamed under a budget.
	Stream *streamStats `json:"stream,omitempty"`
	// Spec is set when a draft speculated.
	Spec *specStats `json:"speculative,omitempty"`
}

func perSecond(n int, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func nonNil(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}

// openModel opens path, or the embedded default model when path is "".
func openModel(path string) (*weights.File, error) {
	if path == "" {
		return defaultmodel.Target()
	}
	return weights.Open(path)
}

// loadTokenizer loads f's tokenizer (path, or the one f carries) and
// checks it fits the model's vocabulary, so that a wrong --tokenizer
// fails here and not at the first request. A --tokenizer of the right size
// that differs from the vocabulary f carries is used, with a note on
// stderr: its text would otherwise turn to gibberish unexplained.
func loadTokenizer(f *weights.File, path string, stderr io.Writer) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizer.ForModel(f, path)
	switch {
	case errors.Is(err, tokenizer.ErrNoVocabulary):
		return nil, fmt.Errorf("%w: %v: pass that tokenizer.bin with --tokenizer", errUsage, err)
	case errors.Is(err, tokenizer.ErrWrongVocabulary):
		return nil, fmt.Errorf("%w: %v; pass the model's own with --tokenizer", errUsage, err)
	case err != nil:
		return nil, err
	}
	if path != "" {
		if own, err := tokenizer.ForModel(f, ""); err == nil && own.Fingerprint() != tok.Fingerprint() {
			fmt.Fprintf(stderr, "note: %s differs from the vocabulary in %s; using %s (leave out --tokenizer to use the file's own)\n", path, f.Path, path)
		}
	}
	return tok, nil
}

// checkSampling refuses generate's numeric flags outside their ranges
// before a model is loaded: out of range they used to switch a transform
// off silently, or fail mid-generation. The sampling ranges are the HTTP
// API's (sched.Params), except that a top-p of 0 turns it off here. It
// returns the options as the server reads a request's.
func checkSampling(maxTokens int, temp, topP float64, topK int, minP, repeat float64) (sample.Options, error) {
	switch {
	case maxTokens < 0:
		return sample.Options{}, fmt.Errorf("%w: --max-tokens %d: want 0 (until EOS or the context is full) or more", errUsage, maxTokens)
	}
	p := sched.Params{Temperature: &temp, TopK: &topK, MinP: &minP, RepeatPenalty: &repeat}
	if topP != 0 {
		p.TopP = &topP
	}
	var req sched.Request
	var fe *sched.FieldError
	if err := p.Apply(&req, 1); errors.As(err, &fe) {
		return sample.Options{}, fmt.Errorf("%w: --%s: %s", errUsage, strings.ReplaceAll(fe.Field, "_", "-"), fe.Msg)
	} else if err != nil {
		return sample.Options{}, err
	}
	return req.Sampling, nil
}

// checkGreedyFlags refuses the flags that shape or seed sampling when the
// run decodes greedily: they would change nothing (the repeat penalty
// does change a greedy run, so it stays).
func checkGreedyFlags(fs *flag.FlagSet, temp float64) error {
	if temp > 0 {
		return nil
	}
	return unusedFlags(fs, "only matters when sampling, and --temperature 0 (the default) decodes greedily: add --temperature (0.8 is common)",
		"top-k", "top-p", "min-p", "seed")
}
