package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/runtime/train"
	"github.com/tandem-llm/tandem/weights"
)

func runEval(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("eval", "--model M [--draft D] [--tokenizer F] [--data TEXT] [--prompts FILE] [flags]",
		"Measures models on held-out text and prompts:\n"+
			"  --data     mean loss (nats per token) and bits per byte of the model, and of\n"+
			"             the draft, over windows of --ctx tokens of a plain-text file;\n"+
			"  --prompts  the draft's greedy top-1 agreement with the model: the model\n"+
			"             continues each prompt greedily for --gen tokens and, at each of\n"+
			"             its tokens, the draft's most likely token is compared with the\n"+
			"             model's (the rate greedy speculative decoding accepts drafts at).\n"+
			"Both models must share the tokenizer (their own, or --tokenizer for llama2.c\n"+
			"files).", stdout, stderr,
		"tandem eval --model target.gguf --draft draft.gguf --data held-out.txt --prompts prompts.txt",
		"tandem eval --model ../shared/models/stories260K.gguf --draft ../shared/models/llama2xs_model.bin --tokenizer ../shared/models/tok512.bin --prompts prompts.txt")
	modelPath := fs.String("model", "", "the model (the target when --draft is given; default: the embedded target)")
	draftPath := fs.String("draft", "", "a draft model to compare with it")
	tokPath := fs.String("tokenizer", "", "tokenizer.bin or GGUF vocabulary (default: the model's own)")
	data := fs.String("data", "", "held-out text (documents separated by blank lines)")
	prompts := fs.String("prompts", "", "prompt file, one prompt per line")
	ctxLen := fs.Int("ctx", 256, "tokens per held-out window (capped by the contexts)")
	windows := fs.Int("windows", 0, "evaluate at most this many windows (0: all)")
	gen := fs.Int("gen", 128, "tokens the model generates per prompt")
	threads := threadsFlag(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *ctxLen < 1 {
		return fmt.Errorf("%w: --ctx %d: want the tokens per held-out window, 1 or more", errUsage, *ctxLen)
	}
	if *windows < 0 {
		return fmt.Errorf("%w: --windows %d: want 0 (all) or more", errUsage, *windows)
	}
	if *gen < 1 {
		return fmt.Errorf("%w: --gen %d: want the tokens to generate per prompt, 1 or more", errUsage, *gen)
	}
	if *data == "" && *prompts == "" {
		return fmt.Errorf("%w: give --data, --prompts or both", errUsage)
	}
	if *prompts != "" && *draftPath == "" {
		return fmt.Errorf("%w: --prompts measures a draft's agreement: give --draft", errUsage)
	}
	pool := kernels.NewPool(*threads)
	defer pool.Close()
	f, err := openModel(*modelPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tok, err := loadTokenizer(f, *tokPath, stderr)
	if err != nil {
		return err
	}
	m, err := model.Load(f, model.Options{Pool: pool})
	if err != nil {
		return err
	}
	defer m.Close()
	models := []*model.Model{m}
	names := []string{f.Path}
	if *draftPath != "" {
		df, err := weights.Open(*draftPath)
		if err != nil {
			return err
		}
		defer df.Close()
		if *tokPath == "" {
			dtok, err := loadTokenizer(df, "", stderr)
			if err != nil {
				return err
			}
			if !sameVocab(tok, dtok) {
				return fmt.Errorf("%s and %s have different vocabularies; a draft must share the model's tokenizer", f.Path, df.Path)
			}
		}
		d, err := model.Load(df, model.Options{Pool: pool})
		if err != nil {
			return err
		}
		defer d.Close()
		models = append(models, d)
		names = append(names, df.Path)
	}
	for i, mm := range models {
		if mm.Config().Vocab != tok.VocabSize() {
			return fmt.Errorf("%s has a vocabulary of %d but the tokenizer has %d tokens", names[i], mm.Config().Vocab, tok.VocabSize())
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	type lossJSON struct {
		Model        string  `json:"model"`
		Params       int     `json:"params"`
		Loss         float64 `json:"loss_nats_per_token"`
		BitsPerByte  float64 `json:"bits_per_byte"`
		Tokens       int     `json:"tokens"`
		BytesPerTok  float64 `json:"bytes_per_token"`
		WindowTokens int     `json:"window_tokens"`
	}
	report := map[string]any{}
	if *data != "" {
		docs, err := readDocs(*data)
		if err != nil {
			return err
		}
		stream, err := train.EncodeDocs(tok, docs)
		if err != nil {
			return err
		}
		var textBytes int
		for _, d := range docs {
			textBytes += len(d)
		}
		bpt := float64(textBytes) / float64(len(stream))
		t := *ctxLen
		for _, mm := range models {
			t = min(t, mm.Config().Context)
		}
		var losses []lossJSON
		for i, mm := range models {
			loss, n, err := train.HeldOutLoss(ctx, mm, stream, t, *windows)
			if errors.Is(err, train.ErrTooLittleData) {
				return fmt.Errorf("--data %s holds %d tokens, fewer than one window of %d (--ctx %d + 1): give more text, or a smaller --ctx", *data, len(stream), t+1, t)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			l := lossJSON{Model: names[i], Params: paramCount(mm.Config()), Loss: loss, Tokens: n, BytesPerTok: bpt,
				BitsPerByte: loss / math.Ln2 / bpt, WindowTokens: t}
			losses = append(losses, l)
			if !*asJSON {
				fmt.Fprintf(stdout, "held-out loss %-40s %s params: %.4f nats/token, %.3f bits/byte (%d tokens in windows of %d, %.2f bytes/token)\n",
					names[i], humanCount(l.Params), l.Loss, l.BitsPerByte, n, t, bpt)
			}
		}
		report["held_out"] = losses
	}
	if *prompts != "" {
		lines, err := readLines(*prompts)
		if err != nil {
			return err
		}
		var ps [][]int32
		for i, l := range lines {
			ids, err := tok.Encode(l, tokenizer.EncodeOptions{AddBOS: true})
			if err != nil {
				return fmt.Errorf("%s line %d: %w", *prompts, i+1, err)
			}
			ps = append(ps, ids)
		}
		res, err := train.Agreement(ctx, models[1], models[0], ps, *gen, stopAtEnd(tok))
		if err != nil {
			return err
		}
		report["agreement"] = map[string]any{"rate": res.Rate(), "positions": res.Positions, "prompts": res.Prompts,
			"target_nll": res.TargetNLL, "draft_nll": res.DraftNLL}
		if !*asJSON {
			fmt.Fprintf(stdout, "agreement: the draft's greedy token is the model's at %.3f of %d positions (%d prompts, up to %d tokens each); mean NLL of the model's greedy tokens: model %.3f, draft %.3f\n",
				res.Rate(), res.Positions, res.Prompts, *gen, res.TargetNLL, res.DraftNLL)
		}
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(report)
	}
	return nil
}

func paramCount(c model.Config) int {
	c.HeadDim = c.Dim / c.Heads
	return train.CountParams(c)
}

// sameVocab reports whether two tokenizers have the same token table.
func sameVocab(a, b *tokenizer.Tokenizer) bool {
	if a.VocabSize() != b.VocabSize() || a.BOS() != b.BOS() || a.EOS() != b.EOS() {
		return false
	}
	for i := range int32(a.VocabSize()) {
		if a.Piece(i) != b.Piece(i) || a.Type(i) != b.Type(i) {
			return false
		}
	}
	return true
}
