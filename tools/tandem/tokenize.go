package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

func runTokenize(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tokenize", "[--model FILE | --tokenizer FILE] [--json] [--bos] [--special] TEXT...",
		"Encodes TEXT (several arguments are joined with spaces) with a model's\n"+
			"vocabulary and prints the token ids. --model takes any GGUF with\n"+
			"tokenizer.ggml.* keys (vocabulary-only files too); --tokenizer takes a\n"+
			"llama2.c tokenizer.bin or a GGUF. With neither, the embedded default\n"+
			"model's vocabulary, the one tandem generate uses without --model.", stdout, stderr,
		`tandem tokenize "Once upon a time"`,
		`tandem tokenize --tokenizer tok512.bin "Once upon a time"`,
		`tandem tokenize --model ggml-vocab-llama-spm.gguf --json --bos "Hello world"`)
	model := fs.String("model", "", "GGUF file whose vocabulary to use")
	tokPath := fs.String("tokenizer", "", "tokenizer.bin or GGUF vocabulary")
	asJSON := fs.Bool("json", false, `print {"ids":[...],"pieces":[...]}`)
	bos := fs.Bool("bos", false, "put the BOS token first")
	special := fs.Bool("special", false, "match special-token text such as <s> as those tokens")
	pos, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	var tok *tokenizer.Tokenizer
	switch {
	case *model != "" && *tokPath != "":
		return fmt.Errorf("%w: give --model or --tokenizer, not both", errUsage)
	case *tokPath == "":
		// The vocabulary the model file carries (a llama2.c .bin has
		// none, which loadTokenizer says), or the embedded model's.
		f, err := openModel(*model)
		if err != nil {
			return err
		}
		defer f.Close()
		if tok, err = loadTokenizer(f, "", stderr); err != nil {
			return err
		}
	default:
		var err error
		if tok, err = tokenizer.Load(*tokPath); err != nil {
			return err
		}
	}
	ids, err := tok.Encode(strings.Join(pos, " "), tokenizer.EncodeOptions{AddBOS: *bos, ParseSpecial: *special})
	if err != nil {
		return err
	}
	if *asJSON {
		pieces := make([]string, len(ids))
		for i, id := range ids {
			pieces[i] = tok.Piece(id)
		}
		if ids == nil {
			ids = []int32{}
		}
		return json.NewEncoder(stdout).Encode(map[string]any{"ids": ids, "pieces": pieces})
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	fmt.Fprintln(stdout, strings.Join(s, " "))
	return nil
}
