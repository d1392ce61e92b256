package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/weights"
)

func runConvert(args []string, stdout, stderr io.Writer) error {
	defer interrupt.Handle(stderr, "tandem convert")() // Ctrl-C removes the unfinished output
	fs := newFlags("convert", "[--type T] [--tokenizer tokenizer.bin] IN OUT.gguf",
		"Writes IN (a llama2.c .bin or a GGUF) as a GGUF v3 file llama.cpp also loads.\n"+
			"Matrices become --type; norms stay f32; a matrix whose rows are not a multiple\n"+
			"of the type's block falls back to f16 (reported). With --type f32 the weights\n"+
			"of a llama2.c model are copied bit for bit. A llama2.c model has no vocabulary:\n"+
			"give its tokenizer.bin with --tokenizer.", stdout, stderr,
		"tandem convert stories260K.bin --tokenizer tok512.bin stories260K.gguf",
		"tandem convert --type q4_0 model.gguf model-q4_0.gguf")
	typ := fs.String("type", "f32", "weight type: f32, f16, bf16, q8_0 or q4_0")
	tokPath := fs.String("tokenizer", "", "llama2.c tokenizer.bin whose vocabulary goes into the GGUF")
	pos, err := parse(fs, args, 2, 2)
	if err != nil {
		return err
	}
	if err := checkOutput("output", pos[1], pos[0], *tokPath); err != nil {
		return err
	}
	dt, err := weights.ParseWriteType(*typ)
	if err != nil {
		return fmt.Errorf("%w: --type: %v", errUsage, err)
	}
	src, err := weights.Open(pos[0])
	if err != nil {
		return err
	}
	defer src.Close()
	if len(src.Tensors) == 0 {
		return fmt.Errorf("%s has no tensors (a vocabulary-only GGUF?): there are no weights to convert", pos[0])
	}
	fellBack := map[weights.DType]int{} // matrices written in another type than --type
	opt := weights.ConvertOptions{Type: dt, Fallback: func(name string, rowLen uint64, to weights.DType) {
		fmt.Fprintf(stderr, "note: %s has rows of %d, not a multiple of the %s block; writing it as %s\n", name, rowLen, dt, to)
		fellBack[to]++
	}}
	_, hasVocab := src.Metadata.Get("tokenizer.ggml.tokens")
	switch {
	case *tokPath != "":
		vocab, err := weights.OpenLlama2CTokenizer(*tokPath)
		if err != nil {
			return err
		}
		if emb, ok := src.Tensor("token_embd.weight"); ok && len(emb.Shape) == 2 && int(emb.Shape[1]) != len(vocab.Tokens) {
			return fmt.Errorf("tokenizer %s has %d tokens but the model's embedding has %d rows: it belongs to another model", *tokPath, len(vocab.Tokens), emb.Shape[1])
		}
		opt.Tokenizer = &weights.Metadata{}
		vocab.SetMetadata(opt.Tokenizer)
	case src.Format == weights.FormatLlama2C:
		return fmt.Errorf("%w: %s is a llama2.c model, which has no vocabulary; pass its tokenizer.bin with --tokenizer", errUsage, pos[0])
	case !hasVocab:
		fmt.Fprintf(stderr, "note: %s has no tokenizer; the output will need --tokenizer to generate text\n", pos[0])
	}

	out := pos[1]
	tmp, err := interrupt.CreateOutput(out)
	if err != nil {
		cause := err // the temporary name means nothing to the user
		if u := errors.Unwrap(err); u != nil {
			cause = u
		}
		return fmt.Errorf("cannot write %s: %w", out, cause)
	}
	defer tmp.Discard() // nothing after the Commit
	bar := progress.New(stderr, "convert", 0)
	opt.Progress = func(done, total uint64) {
		bar.SetTotal(total)
		bar.Set(done)
	}
	if err := weights.Convert(src, tmp, opt); err != nil {
		return err
	}
	bar.Done()
	if err := tmp.Commit(); err != nil {
		return err
	}
	st, _ := os.Stat(out)
	types := dt.String()
	for _, to := range slices.Sorted(maps.Keys(fellBack)) {
		// The type alone would name a file whose matrices are not all it.
		types += fmt.Sprintf(", %d matrices as %s", fellBack[to], to)
	}
	fmt.Fprintf(stdout, "wrote %s (%s, %d tensors, %s)\n", out, types, len(src.Tensors), progress.Bytes(uint64(st.Size())))
	return nil
}
