package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/runtime/corpus"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

func runCorpus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("corpus", "[--size SIZE | --stories N] [--seed S] [--vocab N] OUT.txt\n       tandem corpus --from TEXT --vocab N [--vocab-out V.gguf]",
		"Writes a synthetic corpus of short children's stories (a procedural grammar of\n"+
			"characters, places, objects, feelings, events and dialogue), one story per\n"+
			"line with a blank line between, deterministic from --seed. --first offsets\n"+
			"the story numbers, so held-out text comes from the same seed.\n\n"+
			"With --vocab N it also learns an N-token byte-fallback BPE vocabulary\n"+
			"(SentencePiece style) from the text and writes it as a GGUF holding only\n"+
			"tokenizer keys (--vocab-out, default OUT.vocab.gguf), which `tandem train\n"+
			"--vocab` reads. --from learns the vocabulary of any plain-text file\n"+
			"instead of generating stories (documents are separated by blank lines).", stdout, stderr,
		"tandem corpus --size 20MiB --seed 1 --vocab 1024 stories.txt",
		"tandem corpus --stories 2000 --seed 1 --first 10000000 held-out.txt",
		"tandem corpus --from my-text.txt --vocab 2048 --vocab-out my-vocab.gguf")
	size := fs.String("size", "", "corpus size, e.g. 500KB, 20MiB (KB, MB: powers of 1000; KiB, MiB: powers of 1024), in whole stories: the last may run past it")
	stories := fs.Int("stories", 0, "number of stories (alternative to --size)")
	seed := fs.Uint64("seed", 1, "random seed (same seed, same text)")
	first := fs.Int("first", 0, "index of the first story")
	from := fs.String("from", "", "learn the vocabulary of this plain-text file instead of generating")
	vocab := fs.Int("vocab", 0, "also learn a vocabulary of this many tokens (0: none)")
	vocabOut := fs.String("vocab-out", "", "where the vocabulary goes (default: OUT.vocab.gguf, or TEXT.vocab.gguf with --from)")
	vocabDocs := fs.Int("vocab-docs", 20000, "learn the vocabulary from at most this many documents (0: all)")
	pos, err := parse(fs, args, 0, 1)
	if err != nil {
		return err
	}
	if (*from == "") != (len(pos) == 1) {
		return fmt.Errorf("%w: give the output file OUT.txt, or --from TEXT without one (see tandem corpus --help)", errUsage)
	}
	switch {
	case *vocab < 0:
		return fmt.Errorf("%w: --vocab %d: want a vocabulary size, or 0 for none", errUsage, *vocab)
	case *vocab > 0 && *vocab <= tokenizer.TrainReserved:
		return fmt.Errorf("%w: --vocab %d: a vocabulary needs more than %d tokens (3 special and 256 byte tokens)", errUsage, *vocab, tokenizer.TrainReserved)
	case *vocab == 0 && *vocabOut != "":
		return fmt.Errorf("%w: --vocab-out names where a learned vocabulary goes: add --vocab N", errUsage)
	case *first < 0:
		return fmt.Errorf("%w: --first %d: want a story index, 0 or more", errUsage, *first)
	}
	if *from != "" {
		if err := unusedFlags(fs, "shapes generated stories, and --from reads a text instead", "size", "stories", "seed", "first"); err != nil {
			return err
		}
	}
	textPath := *from
	if len(pos) == 1 {
		textPath = pos[0]
		if err := checkOutput("output", textPath); err != nil {
			return err
		}
	}
	vocabPath := *vocabOut
	if vocabPath == "" {
		vocabPath = strings.TrimSuffix(textPath, ".txt") + ".vocab.gguf"
	}
	if *vocab > 0 {
		// Checked now, not after the text is written: and neither the
		// text read nor the one just written may be replaced by it.
		if filepath.Clean(vocabPath) == filepath.Clean(textPath) {
			return fmt.Errorf("%w: --vocab-out %s is the text; choose another name", errUsage, vocabPath)
		}
		if err := checkOutput("--vocab-out", vocabPath, *from); err != nil {
			return err
		}
	}
	var docs []string
	if *from == "" {
		var nbytes int64
		if *size != "" {
			n, err := units.ParseSize(*size)
			if err != nil {
				return fmt.Errorf("%w: --size: %v", errUsage, err)
			}
			if n > 1<<40 {
				return fmt.Errorf("%w: --size %s: at most 1TiB", errUsage, *size)
			}
			nbytes = int64(n)
		}
		if nbytes <= 0 && *stories <= 0 {
			return fmt.Errorf("%w: give --size or --stories (or --from to read a text)", errUsage)
		}
		if nbytes > 0 && *stories > 0 {
			return fmt.Errorf("%w: give --size or --stories, not both", errUsage)
		}
		start := time.Now()
		bar := progress.New(stderr, "corpus", uint64(nbytes))
		// Written beside the output and renamed over it when complete:
		// Ctrl-C (or a full disk) leaves no text cut mid-story that a
		// later train would read as a whole corpus.
		defer interrupt.Handle(stderr, "tandem corpus")()
		f, err := interrupt.CreateOutput(textPath)
		if err != nil {
			return err
		}
		defer f.Discard() // nothing after the Commit
		n, written, err := corpus.Write(f, corpus.Options{Seed: *seed, Stories: *stories, Bytes: nbytes, First: *first,
			Progress: func(w int64) { bar.Set(uint64(w)) }})
		if err == nil {
			err = f.Commit()
		}
		if err != nil {
			return err
		}
		bar.Done()
		fmt.Fprintf(stdout, "wrote %s: %d stories, %s in %.1fs (seed %d, stories %d..%d)\n", textPath, n, progress.Bytes(uint64(written)),
			time.Since(start).Seconds(), *seed, *first, *first+n-1)
	}
	if *vocab == 0 {
		if *from != "" {
			return fmt.Errorf("%w: --from reads a text to learn a vocabulary from: give --vocab N", errUsage)
		}
		return nil
	}
	if docs, err = readDocs(textPath); err != nil {
		return err
	}
	if *vocabDocs > 0 && len(docs) > *vocabDocs {
		docs = docs[:*vocabDocs]
	}
	out := vocabPath
	start := time.Now()
	md, err := tokenizer.Train(docs, tokenizer.TrainOptions{Vocab: *vocab})
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromMetadata(md)
	if err != nil {
		return fmt.Errorf("the learned vocabulary does not load: %w", err)
	}
	md.Set("general.name", weights.StringValue(fmt.Sprintf("tandem vocabulary (%d tokens)", *vocab)))
	if err := weights.WriteGGUF(out, md, nil, nil); err != nil {
		return err
	}
	var nb, nt int
	for _, d := range docs[:min(len(docs), 500)] {
		ids, _ := tok.Encode(d, tokenizer.EncodeOptions{})
		nb += len(d)
		nt += len(ids)
	}
	fmt.Fprintf(stdout, "wrote %s: %d tokens learned from %d documents in %.1fs; %.2f bytes per token\n",
		out, tok.VocabSize(), len(docs), time.Since(start).Seconds(), float64(nb)/float64(max(nt, 1)))
	return nil
}

// readDocs reads a plain-text corpus file into documents.
func readDocs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	docs, err := corpus.ReadDocuments(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return docs, nil
}
