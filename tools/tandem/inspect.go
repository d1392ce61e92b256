package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/weights"
)

func runInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", "[--json] [--full] FILE",
		"Prints a model file's architecture, hyperparameters, tokenizer and tensor table.\n"+
			"FILE is a GGUF (v2/v3) or a llama2.c .bin; llama2.c files are shown with the\n"+
			"GGUF keys and tensor names tandem maps them to.", stdout, stderr,
		"tandem inspect model.gguf", "tandem inspect --json stories260K.bin")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	full := fs.Bool("full", false, "with --json, include large arrays (vocabularies) in full")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *full && !*asJSON {
		return fmt.Errorf("%w: --full applies to --json (the text shows arrays by length)", errUsage)
	}
	f, err := weights.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	if *asJSON {
		return inspectJSON(f, *full, stdout)
	}
	return inspectText(f, stdout)
}

type tensorJSON struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Shape  []uint64 `json:"shape"`
	Offset uint64   `json:"offset"`
	Bytes  uint64   `json:"bytes"`
}

func inspectJSON(f *weights.File, full bool, w io.Writer) error {
	md := map[string]any{}
	for _, kv := range f.Metadata.All() {
		md[kv.Key] = jsonValue(kv.Value, full)
	}
	tensors := make([]tensorJSON, len(f.Tensors))
	var total uint64
	for i, t := range f.Tensors {
		tensors[i] = tensorJSON{t.Name, t.Type.String(), t.Shape, t.Offset, t.Size}
		total += t.Size
	}
	out := map[string]any{
		"path":         f.Path,
		"format":       f.Format,
		"version":      f.Version,
		"architecture": f.Architecture(),
		"alignment":    f.Alignment,
		"file_bytes":   f.Size,
		"tensor_bytes": total,
		"tensor_count": len(f.Tensors),
		"tensors":      tensors,
		"metadata":     md,
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// jsonValue converts a metadata value for JSON; arrays longer than 64
// become a summary unless full is set, and non-finite floats strings.
func jsonValue(v weights.Value, full bool) any {
	switch x := v.V.(type) {
	case []weights.Value:
		if len(x) > 64 && !full {
			return map[string]any{"type": "array", "elem": v.Elem.String(), "len": len(x)}
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e, full)
		}
		return out
	case float32:
		if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
			return fmt.Sprint(x)
		}
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return fmt.Sprint(x)
		}
	}
	return v.V
}

// shown is s as inspect prints it: quoted with escapes when it holds
// control characters or is not UTF-8, so that a file's strings cannot
// move the cursor, clear the screen or forge lines of the report.
func shown(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

func inspectText(f *weights.File, w io.Writer) error {
	fmt.Fprintf(w, "file:          %s (%s", f.Path, f.Format)
	if f.Format == weights.FormatGGUF {
		fmt.Fprintf(w, " v%d, alignment %d", f.Version, f.Alignment)
	}
	fmt.Fprintf(w, ", %s)\n", progress.Bytes(uint64(f.Size)))
	fmt.Fprintf(w, "architecture:  %s\n", shown(f.Architecture()))
	arch := f.Architecture()
	for _, k := range []string{"context_length", "embedding_length", "block_count", "feed_forward_length",
		"attention.head_count", "attention.head_count_kv", "rope.dimension_count", "rope.freq_base", "attention.layer_norm_rms_epsilon"} {
		if v, ok := f.Metadata.Get(arch + "." + k); ok {
			fmt.Fprintf(w, "  %-34s %s\n", k, shown(fmt.Sprint(v.V)))
		}
	}
	if model, ok := f.Metadata.String("tokenizer.ggml.model"); ok {
		toks, _ := f.Metadata.Get("tokenizer.ggml.tokens")
		bos, _ := f.Metadata.Uint("tokenizer.ggml.bos_token_id")
		eos, _ := f.Metadata.Uint("tokenizer.ggml.eos_token_id")
		fmt.Fprintf(w, "tokenizer:     %s, %d tokens, bos %d, eos %d\n", shown(model), toks.Len(), bos, eos)
	} else {
		fmt.Fprintln(w, "tokenizer:     none in the file (pass --tokenizer to generate)")
	}
	fmt.Fprintf(w, "metadata:      %d keys\n", f.Metadata.Len())
	for _, kv := range f.Metadata.All() {
		s := fmt.Sprint(jsonValue(kv.Value, false))
		if x, ok := kv.Value.V.([]weights.Value); ok && len(x) > 64 {
			s = fmt.Sprintf("[%d × %s]", len(x), kv.Value.Elem) // the summary, not a Go map
		}
		if s = shown(s); len(s) > 80 {
			s = strings.ToValidUTF8(s[:77], "") + "..."
		}
		fmt.Fprintf(w, "  %-40s %-8s %s\n", shown(kv.Key), kv.Value.Type, s)
	}
	var total uint64
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "tensors:\t%d\n  name\ttype\tshape\tbytes\n", len(f.Tensors))
	for _, t := range f.Tensors {
		fmt.Fprintf(tw, "  %s\t%s\t%v\t%d\n", shown(t.Name), t.Type, t.Shape, t.Size)
		total += t.Size
	}
	tw.Flush()
	fmt.Fprintf(w, "total tensor data: %s (%d bytes)\n", progress.Bytes(total), total)
	return nil
}
