package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

func runSynth(args []string, stdout, stderr io.Writer) error {
	defer interrupt.Handle(stderr, "tandem synth")() // Ctrl-C removes the unfinished output
	fs := newFlags("synth", "(--shape NAME | --dims D,H,L,HEADS,KV,VOCAB[,CTX]) [--type T] [--vocab FILE] [--seed N] OUT.gguf",
		"Writes a deterministic random-weight llama model of a real shape, streamed to\n"+
			"disk (a 7B model needs well under 1 GiB of memory). It is for benchmarks and\n"+
			"tests: the text it generates is noise. With --vocab the vocabulary of a GGUF\n"+
			"or tokenizer.bin is embedded (its size must match the shape); without it a\n"+
			"byte-level vocabulary that can encode any text.\n"+
			"Shapes: "+fmt.Sprint(weights.ShapeNames()), stdout, stderr,
		"tandem synth --shape tinyllama-1.1b --type q4_0 /tmp/tinyllama-q4_0.gguf",
		"tandem synth --dims 64,172,4,8,4,512 --type q8_0 --vocab tok512.bin small.gguf")
	shape := fs.String("shape", "", "named shape")
	dims := fs.String("dims", "", "explicit dims: dim,hidden,layers,heads,kv_heads,vocab[,context]")
	typ := fs.String("type", "q4_0", "matrix type: f32, f16, bf16, q8_0 or q4_0")
	vocabPath := fs.String("vocab", "", "GGUF or tokenizer.bin whose vocabulary to embed")
	seed := fs.Uint64("seed", 1, "random seed (same seed, same file)")
	ctx := fs.Int("ctx", 0, "context length to record (default: the shape's)")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	sh, err := shapeFlags(*shape, *dims)
	if err != nil {
		return err
	}
	if *ctx < 0 || *ctx > model.MaxDim {
		return fmt.Errorf("%w: --ctx %d: want 0 (the shape's) up to %d, the most a model may have", errUsage, *ctx, model.MaxDim)
	}
	if *ctx > 0 {
		sh.Context = *ctx
	}
	dt, err := weights.ParseWriteType(*typ)
	if err != nil {
		return fmt.Errorf("%w: --type: %v", errUsage, err)
	}
	if *vocabPath == "" && sh.Vocab < weights.MinByteVocab {
		return fmt.Errorf("%w: a vocabulary of %d tokens: without --vocab, the byte vocabulary synth makes needs at least %d (3 special, 256 bytes and ▁)", errUsage, sh.Vocab, weights.MinByteVocab)
	}
	if err := checkOutput("output", pos[0], *vocabPath); err != nil {
		return err
	}
	opt := weights.SynthOptions{Shape: sh, Type: dt, Seed: *seed}
	if *vocabPath != "" {
		if opt.Vocab, err = vocabMetadata(*vocabPath); err != nil {
			return err
		}
	}
	bar := progress.New(stderr, "synth", 0)
	opt.Progress = func(done, total uint64) { bar.SetTotal(total); bar.Set(done) }
	start := time.Now()
	if err := weights.Synth(pos[0], opt); err != nil {
		return err
	}
	bar.Done()
	st, err := os.Stat(pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s %s, %s in %.1fs\n", pos[0], sh.Name, dt, progress.Bytes(uint64(st.Size())), time.Since(start).Seconds())
	return nil
}

// vocabMetadata reads the tokenizer keys of a GGUF or a tokenizer.bin.
func vocabMetadata(path string) (*weights.Metadata, error) {
	if _, err := tokenizer.Load(path); err != nil { // validates either format
		return nil, err
	}
	md := &weights.Metadata{}
	if f, err := weights.Open(path); err == nil {
		defer f.Close()
		for _, kv := range f.Metadata.All() {
			if len(kv.Key) > 10 && kv.Key[:10] == "tokenizer." {
				md.Set(kv.Key, kv.Value)
			}
		}
		return md, nil
	}
	v, err := weights.OpenLlama2CTokenizer(path)
	if err != nil {
		return nil, err
	}
	v.SetMetadata(md)
	return md, nil
}

// shapeFlags resolves the --shape and --dims flags (exactly one given).
func shapeFlags(shape, dims string) (weights.Shape, error) {
	var sh weights.Shape
	var err error
	switch {
	case shape != "" && dims != "":
		return sh, fmt.Errorf("%w: give --shape or --dims, not both", errUsage)
	case shape != "":
		if sh, err = weights.LookupShape(shape); err != nil {
			err = fmt.Errorf("%v; or give --dims", err)
		}
	case dims != "":
		sh, err = weights.ParseDims(dims)
	default:
		return sh, fmt.Errorf("%w: --shape or --dims is required", errUsage)
	}
	if err != nil {
		return sh, fmt.Errorf("%w: %v", errUsage, err)
	}
	return sh, nil
}
