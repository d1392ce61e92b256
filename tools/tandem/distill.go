package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/runtime/train"
	"github.com/tandem-llm/tandem/weights"
)

func runDistill(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("distill", "--target T.gguf --out D.gguf [--shape DIMS] [--tokens N] [--prompts FILE] [--kl] [flags]",
		"Trains a small draft model for a target, with the target's tokenizer, on text\n"+
			"the target writes itself: it samples --tokens tokens from the target (each\n"+
			"sequence starting with BOS and a prompt from --prompts, or with BOS alone),\n"+
			"trains a draft of --shape on them (with --kl, on the target's full next-token\n"+
			"distributions: KL divergence to its soft targets), writes it, and reports\n"+
			"the draft's greedy top-1 agreement with the target on held-out prompts (every\n"+
			"5th line of --prompts; with no prompts, the starts of held-out samples):\n"+
			"the rate at which speculative decoding accepts the draft's tokens.\n\n"+
			"The target is any llama-architecture GGUF with its vocabulary inside, or a\n"+
			"llama2.c .bin with --tokenizer. The shape is dim,hidden,layers,heads,kv[,ctx]\n"+
			"(default: half the target's width and depth). --init starts from an existing\n"+
			"draft (for example one trained on the corpus with tandem train).", stdout, stderr,
		"tandem distill --target ../shared/models/stories260K.gguf --shape 64,192,5,8,4 --tokens 3000000 --kl --prompts prompts.txt --out draft.gguf",
		"tandem distill --target target.gguf --init draft-pretrained.gguf --tokens 2000000 --kl --out draft.gguf --type q8_0")
	targetPath := fs.String("target", "", "target model (GGUF, or llama2.c .bin with --tokenizer)")
	tokPath := fs.String("tokenizer", "", "the target's tokenizer, when its file has none (tokenizer.bin or GGUF)")
	out := fs.String("out", "", "output draft model")
	shapeFlag := fs.String("shape", "", "draft shape dim,hidden,layers,heads,kv_heads[,context] (default: half the target)")
	promptsPath := fs.String("prompts", "", "prompt file, one prompt per line (default: unconditional samples)")
	kl := fs.Bool("kl", false, "train on the target's soft targets (KL divergence) instead of its sampled tokens alone")
	temp := fs.Float64("temperature", 1, "sampling temperature of the training text")
	seqLen := fs.Int("seq", 256, "tokens per training sequence (capped by both contexts)")
	gen := fs.Int("gen", 128, "tokens the target generates per held-out prompt for the agreement check")
	tf := addTrainFlags(fs, 2e-3)
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *targetPath == "" || *out == "" {
		return fmt.Errorf("%w: --target and --out are required", errUsage)
	}
	if err := tf.check(fs); err != nil {
		return err
	}
	if err := tf.checkOutputs(*out, *targetPath, *tokPath, *promptsPath, *tf.init); err != nil {
		return err
	}
	if *gen < 0 {
		return fmt.Errorf("%w: --gen %d: want the tokens to generate per held-out prompt, 0 or more", errUsage, *gen)
	}
	// Greedy text would repeat one continuation of each start, and 0 read
	// as the default 1 further down: refused, not silently changed.
	if !(*temp > 0 && *temp <= 2) {
		return fmt.Errorf("%w: --temperature %v: want above 0 (the target samples the training text) up to 2", errUsage, *temp)
	}
	if *seqLen < 2 {
		return fmt.Errorf("%w: --seq %d: a training sequence needs at least 2 tokens (an input and its next)", errUsage, *seqLen)
	}
	dt, err := tf.outType()
	if err != nil {
		return err
	}
	tfile, err := weights.Open(*targetPath)
	if err != nil {
		return err
	}
	defer tfile.Close()
	vmd, tok, err := targetVocab(tfile, *tokPath)
	if err != nil {
		return err
	}
	pool := kernels.NewPool(*tf.threads)
	defer pool.Close()
	target, err := model.Load(tfile, model.Options{Pool: pool})
	if err != nil {
		return err
	}
	defer target.Close()
	tc := target.Config()
	if tc.Vocab != tok.VocabSize() {
		return fmt.Errorf("the tokenizer has %d tokens but the target's vocabulary is %d: they do not belong together", tok.VocabSize(), tc.Vocab)
	}

	// The draft's shape and starting point.
	var dp *train.Params[float32]
	var dc model.Config
	if *tf.init != "" {
		if dp, err = loadParams(*tf.init); err != nil {
			return err
		}
		dc = dp.Cfg
		if *shapeFlag != "" {
			if c, err := train.ParseShape(*shapeFlag, tc.Vocab, dc.Context); err != nil || train.ShapeString(c) != train.ShapeString(dc) {
				return fmt.Errorf("%w: --shape %s does not match --init's shape %s", errUsage, *shapeFlag, train.ShapeString(dc))
			}
		}
		if dc.Vocab != tc.Vocab {
			return fmt.Errorf("--init %s has a vocabulary of %d, the target's is %d", *tf.init, dc.Vocab, tc.Vocab)
		}
	} else {
		shape := *shapeFlag
		if shape == "" {
			shape = halfShape(tc)
		}
		if dc, err = train.ParseShape(shape, tc.Vocab, min(256, tc.Context)); err != nil {
			return fmt.Errorf("%w: --shape: %v", errUsage, err)
		}
		if dp, err = train.NewParams[float32](dc); err != nil {
			return err
		}
		dp.Init(*tf.seed)
	}
	seq := min(*seqLen, tc.Context, dc.Context)
	o, err := tf.options(seq, *out)
	if err != nil {
		return err
	}
	o.Vocab = vmd

	// Prompts: every 5th line is held out for the agreement check.
	var trainPrompts, heldPrompts [][]int32
	if *promptsPath != "" {
		lines, err := readLines(*promptsPath)
		if err != nil {
			return err
		}
		for i, l := range lines {
			ids, err := tok.Encode(l, tokenizer.EncodeOptions{})
			if err != nil {
				return fmt.Errorf("%s line %d: %w", *promptsPath, i+1, err)
			}
			if len(lines) >= 5 && i%5 == 4 {
				heldPrompts = append(heldPrompts, append([]int32{tok.BOS()}, ids...))
			} else {
				trainPrompts = append(trainPrompts, ids)
			}
		}
		if len(heldPrompts) == 0 {
			fmt.Fprintf(stderr, "note: %s has fewer than 5 prompts, so the agreement check reuses the training prompts\n", *promptsPath)
			for _, p := range trainPrompts {
				heldPrompts = append(heldPrompts, append([]int32{tok.BOS()}, p...))
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sampleOpts := func(tokens int64, seed uint64, prompts [][]int32) train.SampleOptions {
		n := int((tokens + int64(seq)) / int64(seq+1))
		return train.SampleOptions{Sequences: max(1, n), Length: seq + 1, Prompts: prompts, BOS: tok.BOS(), EOS: tok.EOS(),
			Temperature: float32(*temp), Seed: seed}
	}
	total := int64(o.Steps) * int64(o.Batch) * int64(seq)
	// One epoch of samples: more text helps more than repeating it, and
	// sampling costs one target forward per token, less than training.
	start := time.Now()
	so := sampleOpts(total, *tf.seed, trainPrompts)
	lastPct := -1
	so.Progress = func(done, all int) {
		if pct := 100 * done / all; pct/10 != lastPct/10 {
			lastPct = pct
			fmt.Fprintf(stderr, "sampling: %d of %d sequences of %d tokens (%.0fs)\n", done, all, seq+1, time.Since(start).Seconds())
		}
	}
	samples, err := train.Sample(ctx, target, so)
	if err != nil {
		return err
	}
	validSamples, err := train.Sample(ctx, target, sampleOpts(int64(8*(seq+1)), *tf.seed+1e6, trainPrompts))
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "sampled %d tokens from %s in %.1fs (%.0f tok/s, temperature %g)\n", len(samples), *targetPath,
		time.Since(start).Seconds(), float64(len(samples))/time.Since(start).Seconds(), *temp)
	if len(heldPrompts) == 0 {
		// Held-out prompts: the first tokens of samples the draft never sees.
		const n, k = 16, 5
		hs, err := train.Sample(ctx, target, train.SampleOptions{Sequences: n, Length: k, BOS: tok.BOS(), EOS: tok.EOS(),
			Temperature: float32(*temp), Seed: *tf.seed + 2e6})
		if err != nil {
			return err
		}
		for i := range n {
			heldPrompts = append(heldPrompts, hs[i*k:(i+1)*k])
		}
	}

	var teacher train.Teacher
	if *kl {
		teacher = &train.ModelTeacher{M: target}
	}
	tw, err := train.NewWindowsStride(samples, seq, seq+1, o.Seed)
	if err != nil {
		return err
	}
	vw, err := train.NewWindowsStride(validSamples, seq, seq+1, o.Seed)
	if err != nil {
		return err
	}
	tr, err := train.NewTrainerWindows(dp, tw, vw, teacher, pool, o)
	if err != nil {
		return err
	}
	if err := finishTraining(tr, tf, o, vmd, *out, dt, pool, stdout, stderr); err != nil {
		return err
	}

	// Agreement of the written (possibly quantized) draft.
	dfile, err := weights.Open(*out)
	if err != nil {
		return err
	}
	defer dfile.Close()
	draft, err := model.Load(dfile, model.Options{Pool: pool})
	if err != nil {
		return err
	}
	defer draft.Close()
	res, err := train.Agreement(ctx, draft, target, heldPrompts, *gen, stopAtEnd(tok))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "agreement: the draft's greedy token is the target's at %.3f of %d positions (%d held-out prompts); mean NLL of the target's greedy tokens: target %.3f, draft %.3f\n",
		res.Rate(), res.Positions, res.Prompts, res.TargetNLL, res.DraftNLL)
	return nil
}

// targetVocab returns the tokenizer keys of a model file, or of --tokenizer.
func targetVocab(f *weights.File, tokPath string) (*weights.Metadata, *tokenizer.Tokenizer, error) {
	var vmd *weights.Metadata
	var err error
	switch {
	case tokPath != "":
		if vmd, err = vocabMetadata(tokPath); err != nil {
			return nil, nil, err
		}
	default:
		if _, ok := f.Metadata.Get("tokenizer.ggml.tokens"); !ok {
			return nil, nil, fmt.Errorf("%w: %s has no tokenizer inside (llama2.c models keep it in a separate tokenizer.bin): pass that tokenizer.bin with --tokenizer", errUsage, f.Path)
		}
		vmd = &weights.Metadata{}
		for _, kv := range f.Metadata.All() {
			if strings.HasPrefix(kv.Key, "tokenizer.") {
				vmd.Set(kv.Key, kv.Value)
			}
		}
	}
	tok, err := tokenizer.FromMetadata(vmd)
	if err != nil {
		return nil, nil, err
	}
	return vmd, tok, nil
}

// halfShape is the default draft: half the target's width, FFN and depth.
func halfShape(c model.Config) string {
	heads := max(1, c.Heads/2)
	dim := max(2*heads, c.Dim/2/(2*heads)*(2*heads))
	kv := max(1, min(heads, c.KVHeads/2))
	for heads%kv != 0 {
		kv--
	}
	return fmt.Sprintf("%d,%d,%d,%d,%d,%d", dim, max(8, c.Hidden/2), max(1, c.Layers/2), heads, kv, min(256, c.Context))
}

// stopAtEnd ends a continuation at EOS or BOS (llama2.c models end a
// story with BOS), as generate does.
func stopAtEnd(tok *tokenizer.Tokenizer) func(int32) bool {
	return func(id int32) bool { return id == tok.EOS() || id == tok.BOS() }
}

// readLines reads the non-blank lines of a file.
func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no prompts (one per line)", path)
	}
	return out, nil
}
