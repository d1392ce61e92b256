package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

func runInflate(args []string, stdout, stderr io.Writer) error {
	defer interrupt.Handle(stderr, "tandem inflate")() // Ctrl-C removes the unfinished output
	fs := newFlags("inflate", "--from SMALL [--tokenizer FILE] (--shape NAME | --dims D,H,L,HEADS,KV,VOCAB[,CTX]) [--type T] OUT.gguf",
		"Writes a large model whose function equals a real small one's: SMALL's weights\n"+
			"embedded in the large shape with zero padding (extra heads, FFN units and\n"+
			"layers leave the residual stream unchanged; the attention scale, RoPE pairs,\n"+
			"grouped-query heads and RMSNorm are adjusted so nothing else changes). Its\n"+
			"greedy output is SMALL's, while its bytes and compute are the large shape's:\n"+
			"a realistic target or draft for benchmarks, with real agreement between them.\n"+
			"The vocabulary stays SMALL's (the VOCAB of --dims is ignored), and so does the\n"+
			"context length unless --ctx is given. SMALL is a GGUF or a llama2.c .bin (pass\n"+
			"--tokenizer to embed its vocabulary). Written streamed: memory stays small\n"+
			"whatever the output size.\n"+
			"Shapes: "+fmt.Sprint(weights.ShapeNames()), stdout, stderr,
		"tandem inflate --from stories260K.bin --tokenizer tok512.bin --shape tinyllama-1.1b --type q4_0 target.gguf",
		"tandem inflate --from llama2xs_model.bin --tokenizer tok512.bin --shape stories110m --type q8_0 draft.gguf")
	from := fs.String("from", "", "the small source model (GGUF or llama2.c .bin)")
	tokPath := fs.String("tokenizer", "", "GGUF or tokenizer.bin whose vocabulary to embed (default: the source's own, if any)")
	shape := fs.String("shape", "", "named large shape")
	dims := fs.String("dims", "", "explicit large dims: dim,hidden,layers,heads,kv_heads,vocab[,context]")
	typ := fs.String("type", "q4_0", "matrix type: f32, f16, bf16, q8_0 or q4_0")
	ctx := fs.Int("ctx", 0, "context length to record (default: the source's)")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *from == "" {
		return fmt.Errorf("%w: --from SMALL is required", errUsage)
	}
	sh, err := shapeFlags(*shape, *dims)
	if err != nil {
		return err
	}
	if *ctx < 0 || *ctx > model.MaxDim {
		return fmt.Errorf("%w: --ctx %d: want 0 (the source's) up to %d, the most a model may have", errUsage, *ctx, model.MaxDim)
	}
	sh.Context = *ctx
	dt, err := weights.ParseWriteType(*typ)
	if err != nil {
		return fmt.Errorf("%w: --type: %v", errUsage, err)
	}
	if err := checkOutput("output", pos[0], *from, *tokPath); err != nil {
		return err
	}
	src, err := weights.Open(*from)
	if err != nil {
		return err
	}
	defer src.Close()
	opt := weights.InflateOptions{Shape: sh, Type: dt}
	if *tokPath != "" {
		if opt.Tokenizer, err = vocabMetadata(*tokPath); err != nil {
			return err
		}
	}
	bar := progress.New(stderr, "inflate", 0)
	opt.Progress = func(done, total uint64) { bar.SetTotal(total); bar.Set(done) }
	start := time.Now()
	if err := weights.Inflate(src, pos[0], opt); err != nil {
		if errors.Is(err, weights.ErrInflateShape) {
			return fmt.Errorf("%w: %v; choose a --shape at least as wide, deep and with as many heads as the source", errUsage, err)
		}
		return err
	}
	bar.Done()
	st, err := os.Stat(pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s inflated to %s %s, %s in %.1fs\n", pos[0], *from, sh.Name, dt, progress.Bytes(uint64(st.Size())), time.Since(start).Seconds())
	if *tokPath == "" {
		if _, ok := src.Metadata.Get("tokenizer.ggml.tokens"); !ok {
			fmt.Fprintln(stderr, "note: the source has no vocabulary and no --tokenizer was given; run the output with --tokenizer")
		}
	}
	return nil
}
