package tokenizer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// cache loads each real tokenizer once per test binary.
var cache sync.Map

func load(t testing.TB, name string) *Tokenizer {
	t.Helper()
	path := testutil.Model(t, name)
	if tk, ok := cache.Load(path); ok {
		return tk.(*Tokenizer)
	}
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cache.Store(path, tk)
	return tk
}

type vector struct {
	in  string
	out []int32
}

// readVectors parses llama.cpp's .inp/.out tokenizer vectors (format in
// ../shared/testdata/README.md).
func readVectors(t testing.TB, vocab string) []vector {
	t.Helper()
	inp, err := os.ReadFile(testutil.Testdata(t, vocab+".inp"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(testutil.Testdata(t, vocab+".out"))
	if err != nil {
		t.Fatal(err)
	}
	const sep = "\n__ggml_vocab_test__\n"
	ins := strings.Split(string(inp), sep)
	if ins[len(ins)-1] == "" {
		ins = ins[:len(ins)-1]
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(ins) {
		t.Fatalf("%s: %d inputs but %d output lines", vocab, len(ins), len(lines))
	}
	vs := make([]vector, len(ins))
	for i, in := range ins {
		vs[i].in = in
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s.out line %d: %v", vocab, i+1, err)
			}
			vs[i].out = append(vs[i].out, int32(id))
		}
	}
	return vs
}

func TestVectors(t *testing.T) {
	for _, vocab := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		t.Run(vocab, func(t *testing.T) {
			tk := load(t, vocab)
			vs := readVectors(t, vocab)
			pass := 0
			for i, v := range vs {
				got, err := tk.Encode(v.in, EncodeOptions{})
				if err != nil {
					t.Errorf("case %d %q: %v", i, v.in, err)
					continue
				}
				if !reflect.DeepEqual(got, v.out) && !(len(got) == 0 && len(v.out) == 0) {
					t.Errorf("case %d %q:\n got %v\nwant %v", i, v.in, got, v.out)
					continue
				}
				pass++
			}
			if len(vs) < 30 {
				t.Errorf("only %d vectors read", len(vs))
			}
			t.Logf("%s: %d/%d vectors match", vocab, pass, len(vs))
		})
	}
}

// TestKnownSpecials pins the ids and flags the two vocabularies declare.
func TestKnownSpecials(t *testing.T) {
	cases := []struct {
		file          string
		kind          Kind
		n             int
		bos, eos      int32
		addBOS        bool
		piece         int32
		pieceText     string
		pieceTypeWant int32
	}{
		{"ggml-vocab-llama-spm.gguf", SPM, 32000, 1, 2, true, 15043, "\u2581Hello", weights.TokenNormal},
		{"tokenizer.bin", SPM, 32000, 1, 2, true, 13, "<0x0A>", weights.TokenByte},
		{"tok512.bin", SPM, 512, 1, 2, true, 1, "<s>", weights.TokenControl},
		{"stories260K.gguf", SPM, 512, 1, 2, true, 0, "<unk>", weights.TokenUnknown},
		{"ggml-vocab-gpt-2.gguf", BPE, 50257, 50256, 50256, false, 50256, "<|endoftext|>", weights.TokenControl},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			tk := load(t, tc.file)
			if tk.Kind() != tc.kind || tk.VocabSize() != tc.n || tk.BOS() != tc.bos || tk.EOS() != tc.eos || tk.AddBOS() != tc.addBOS {
				t.Fatalf("got kind %v vocab %d bos %d eos %d addBOS %v", tk.Kind(), tk.VocabSize(), tk.BOS(), tk.EOS(), tk.AddBOS())
			}
			if p := tk.Piece(tc.piece); p != tc.pieceText || tk.Type(tc.piece) != tc.pieceTypeWant {
				t.Fatalf("Piece(%d) = %q type %d, want %q type %d", tc.piece, p, tk.Type(tc.piece), tc.pieceText, tc.pieceTypeWant)
			}
			if id, ok := tk.Lookup(tc.pieceText); !ok || id != tc.piece {
				t.Fatalf("Lookup(%q) = %d, %v", tc.pieceText, id, ok)
			}
			if tk.Piece(-1) != "" || tk.Piece(int32(tc.n)) != "" {
				t.Fatal("Piece out of range is not empty")
			}
		})
	}
}

// sampleTexts are the llama vectors' inputs plus a few of our own.
func sampleTexts(t testing.TB) []string {
	var ss []string
	for _, v := range readVectors(t, "ggml-vocab-llama-spm.gguf") {
		ss = append(ss, v.in)
	}
	return append(ss, "Once upon a time", "<s>literal</s> <0x0A> <unk>", "\u2581already marked", "a\x00b", "tab\tend ")
}

// TestLlama2CMatchesGGUF: the llama2.c tokenizer.bin and the GGUF
// vocabulary are the same vocabulary, so they must agree on everything.
func TestLlama2CMatchesGGUF(t *testing.T) {
	bin := load(t, "tokenizer.bin")
	gg := load(t, "ggml-vocab-llama-spm.gguf")
	for i, s := range sampleTexts(t) {
		for _, opt := range []EncodeOptions{{}, {AddBOS: true}, {AddBOS: true, ParseSpecial: true}} {
			a, err := bin.Encode(s, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, err := gg.Encode(s, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("case %d %q %+v: tokenizer.bin %v, gguf %v", i, s, opt, a, b)
			}
			da, _ := bin.Decode(a)
			db, _ := gg.Decode(b)
			if da != db {
				t.Errorf("case %d: decode differs: %q vs %q", i, da, db)
			}
		}
	}
}

type greedyRecord struct {
	Prompt       string  `json:"prompt"`
	PromptIDs    []int32 `json:"prompt_ids"`
	GeneratedIDs []int32 `json:"generated_ids"`
}

func readGreedy(t testing.TB, name string) []greedyRecord {
	t.Helper()
	f, err := os.Open(testutil.Testdata(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []greedyRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		var r greedyRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil || len(recs) == 0 {
		t.Fatalf("%s: %d records, %v", name, len(recs), err)
	}
	return recs
}

// TestGreedyPrompts: tok512.bin (and stories260K.gguf's embedded copy)
// reproduce the reference implementation's prompt ids, and decoding whole
// runs gives the prompt followed by readable text.
func TestGreedyPrompts(t *testing.T) {
	for _, file := range []string{"tok512.bin", "stories260K.gguf"} {
		for _, ref := range []string{"stories260K.greedy.jsonl", "llama2xs.greedy.jsonl"} {
			t.Run(file+"/"+ref, func(t *testing.T) {
				tk := load(t, file)
				for _, r := range readGreedy(t, ref) {
					got, err := tk.Encode(r.Prompt, EncodeOptions{AddBOS: true})
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, r.PromptIDs) {
						t.Errorf("%q: got %v, want %v", r.Prompt, got, r.PromptIDs)
					}
					all := append(append([]int32(nil), r.PromptIDs...), r.GeneratedIDs...)
					text, err := tk.Decode(all)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasPrefix(text, r.Prompt) {
						t.Errorf("decoded text %q does not start with the prompt %q", text, r.Prompt)
					}
					words := 0
					for _, c := range text {
						if c == utf8.RuneError || !unicode.IsPrint(c) && !unicode.IsSpace(c) {
							t.Fatalf("decoded text has %q: %q", c, text)
						}
						if c == ' ' {
							words++
						}
					}
					if words < len(r.GeneratedIDs)/4 {
						t.Errorf("decoded text has only %d spaces for %d tokens: %q", words, len(all), text)
					}
				}
			})
		}
	}
}

func TestGreedySampleText(t *testing.T) {
	tk := load(t, "tok512.bin")
	r := readGreedy(t, "stories260K.greedy.jsonl")[0]
	text, err := tk.Decode(append(append([]int32(nil), r.PromptIDs...), r.GeneratedIDs...))
	if err != nil {
		t.Fatal(err)
	}
	// Karpathy's published reference continuation (SOURCES.md).
	const want = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball"
	if !strings.HasPrefix(text, want) {
		t.Fatalf("got %q", text[:min(len(text), 200)])
	}
}

// streamDecode feeds ids one at a time and checks that no piece splits a
// character.
func streamDecode(t *testing.T, tk *Tokenizer, ids []int32) string {
	t.Helper()
	d := tk.NewDecoder()
	var sb strings.Builder
	for _, id := range ids {
		s := d.Next(id)
		if !utf8.ValidString(s) {
			t.Fatalf("Next(%d) returned invalid UTF-8 %q", id, s)
		}
		sb.WriteString(s)
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

func TestDecoderStreaming(t *testing.T) {
	for _, file := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "tok512.bin"} {
		t.Run(file, func(t *testing.T) {
			tk := load(t, file)
			check := func(ids []int32) {
				t.Helper()
				want, err := tk.Decode(ids)
				if err != nil {
					t.Fatal(err)
				}
				if got := streamDecode(t, tk, ids); got != want {
					t.Fatalf("ids %v: stream %q, Decode %q", ids, got, want)
				}
			}
			for _, s := range sampleTexts(t) {
				ids, err := tk.Encode(s, EncodeOptions{AddBOS: true})
				if err != nil {
					t.Fatal(err)
				}
				check(ids)
			}
			rng := rand.New(rand.NewSource(1))
			for i := 0; i < 2000; i++ {
				ids := make([]int32, rng.Intn(12))
				for j := range ids {
					if rng.Intn(2) == 0 && tk.Kind() == SPM {
						ids[j] = int32(3 + rng.Intn(256)) // byte tokens: partial and invalid UTF-8
					} else {
						ids[j] = int32(rng.Intn(tk.VocabSize()))
					}
				}
				check(ids)
			}
		})
	}
}

// TestDecodeAfter: an answer's text is what Decode of the whole sequence
// adds after the prompt's, whose first piece keeps its leading space.
func TestDecodeAfter(t *testing.T) {
	for _, file := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "tok512.bin"} {
		t.Run(file, func(t *testing.T) {
			tk := load(t, file)
			for _, s := range sampleTexts(t) {
				ids, err := tk.Encode(s, EncodeOptions{AddBOS: true})
				if err != nil {
					t.Fatal(err)
				}
				for cut := 1; cut < len(ids); cut++ {
					whole, _ := tk.Decode(ids)
					head, _ := tk.Decode(ids[:cut])
					if !strings.HasPrefix(whole, head) {
						continue // a character split at the cut: U+FFFD in head alone
					}
					if got := tk.DecodeAfter(ids[:cut], ids[cut:]); got != whole[len(head):] {
						t.Fatalf("%q cut at %d: DecodeAfter %q, want %q", s, cut, got, whole[len(head):])
					}
				}
			}
		})
	}
	tk := load(t, "tok512.bin")
	prompt, _ := tk.Encode("Lily and Tom went to the park.", EncodeOptions{AddBOS: true})
	answer, _ := tk.Encode("They saw a dog.", EncodeOptions{})
	if got := tk.DecodeAfter(prompt, answer); got != " They saw a dog." {
		t.Errorf("DecodeAfter %q, want the answer's leading space kept", got)
	}
}

func TestDecoderHoldsPartialRune(t *testing.T) {
	tk := load(t, "ggml-vocab-llama-spm.gguf")
	// "▁" is E2 96 81: three byte-fallback tokens.
	d := tk.NewDecoder()
	steps := []struct {
		id   int32
		want string
	}{
		{15043, "Hello"}, {3 + 0xE2, ""}, {3 + 0x96, ""}, {3 + 0x81, "\u2581"}, {2, ""}, {3 + 0xF0, ""},
	}
	for i, s := range steps {
		if got := d.Next(s.id); got != s.want {
			t.Fatalf("step %d Next(%d) = %q, want %q", i, s.id, got, s.want)
		}
	}
	if got := d.Flush(); got != "\uFFFD" {
		t.Fatalf("Flush = %q, want U+FFFD for the dangling F0", got)
	}
	if got := d.Next(-5); got != "" {
		t.Fatalf("Next(-5) = %q", got)
	}
	d.Reset()
	if got := d.Next(15043); got != "Hello" {
		t.Fatalf("after Reset: %q", got)
	}
}

func TestDecode(t *testing.T) {
	spm := load(t, "ggml-vocab-llama-spm.gguf")
	gpt := load(t, "ggml-vocab-gpt-2.gguf")
	cases := []struct {
		name string
		tk   *Tokenizer
		ids  []int32
		want string
	}{
		{"bos strips prefix", spm, []int32{1, 29871, 15043, 3186}, " Hello world"},
		{"no bos strips prefix", spm, []int32{15043, 3186}, "Hello world"},
		{"eos renders nothing", spm, []int32{15043, 2}, "Hello"},
		{"byte tokens", spm, []int32{29871, 13, 13}, "\n\n"},
		{"invalid bytes", spm, []int32{3 + 0xE2, 3 + 0x41}, "\uFFFDA"},
		{"unknown", spm, []int32{0}, "\u2585"},
		{"gpt2", gpt, []int32{15496, 995}, "Hello world"},
		{"gpt2 leading space kept", gpt, []int32{220, 220}, "  "},
		{"gpt2 endoftext", gpt, []int32{15496, 50256}, "Hello"},
		{"empty", spm, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tk.Decode(tc.ids)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, bad := range [][]int32{{-1}, {15043, 32000}} {
		if _, err := spm.Decode(bad); !errors.Is(err, ErrUnknownToken) {
			t.Errorf("Decode(%v): got %v, want ErrUnknownToken", bad, err)
		}
	}
}

func TestEncodeOptions(t *testing.T) {
	spm := load(t, "ggml-vocab-llama-spm.gguf")
	gpt := load(t, "ggml-vocab-gpt-2.gguf")
	cases := []struct {
		name string
		tk   *Tokenizer
		text string
		opt  EncodeOptions
		want []int32
	}{
		{"bos", spm, "Hello world", EncodeOptions{AddBOS: true}, []int32{1, 15043, 3186}},
		{"bos only", spm, "", EncodeOptions{AddBOS: true}, []int32{1}},
		{"special parsed", spm, "<s>Hello</s>", EncodeOptions{ParseSpecial: true}, []int32{1, 15043, 2}},
		{"special not parsed", spm, "</s>", EncodeOptions{}, nil},
		{"gpt2 special parsed", gpt, "Hello<|endoftext|>", EncodeOptions{ParseSpecial: true}, []int32{15496, 50256}},
		{"gpt2 bos", gpt, "Hello", EncodeOptions{AddBOS: true}, []int32{50256, 15496}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tk.Encode(tc.text, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				// Special text not parsed must not yield the control token.
				for _, id := range got {
					if tc.tk.Type(id) == weights.TokenControl {
						t.Fatalf("got control token %d in %v", id, got)
					}
				}
				if s, _ := tc.tk.Decode(got); s != tc.text {
					t.Fatalf("round trip %q -> %v -> %q", tc.text, got, s)
				}
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEncodeInvalidUTF8(t *testing.T) {
	for _, file := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		tk := load(t, file)
		for _, tc := range []struct {
			text string
			off  int
		}{{"\xff", 0}, {"ab\xe2\x96", 2}, {"héllo\x80", 6}} {
			_, err := tk.Encode(tc.text, EncodeOptions{})
			if !errors.Is(err, ErrInvalidUTF8) || !strings.Contains(err.Error(), fmt.Sprintf("byte offset %d", tc.off)) {
				t.Errorf("%s: Encode(%q): got %v, want ErrInvalidUTF8 at offset %d", file, tc.text, err, tc.off)
			}
		}
	}
}

func TestSplitGPT2(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a \n\nb", []string{"a", " \n", "\n", "b"}},
		{"x   ", []string{"x", "   "}},
		{"I've 'told he's", []string{"I", "'ve", " '", "told", " he", "'s"}},
		{"I'd they'll we're 'm't", []string{"I", "'d", " they", "'ll", " we", "'re", " '", "m", "'t"}},
		{"'RE We'Ve", []string{"'", "RE", " We", "'", "Ve"}},
		{"3.14 ab12", []string{"3", ".", "14", " ab", "12"}},
		{" ??!x", []string{" ??!", "x"}},
		{"\t\tx", []string{"\t", "\t", "x"}},
		{"日本語 テスト", []string{"日本語", " テスト"}},
		{"a\u3000\u3000b", []string{"a", "\u3000", "\u3000", "b"}},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			var got []string
			splitGPT2(tc.in, func(_ int, p string) bool { got = append(got, p); return true })
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFromMetadataErrors(t *testing.T) {
	base := func() *weights.Metadata {
		md := &weights.Metadata{}
		md.Set("tokenizer.ggml.model", weights.StringValue("llama"))
		md.Set("tokenizer.ggml.tokens", weights.StringsValue([]string{"<unk>", "<s>", "</s>", "\u2581a"}))
		md.Set("tokenizer.ggml.scores", weights.Float32sValue([]float32{0, 0, 0, -1}))
		md.Set("tokenizer.ggml.token_type", weights.Int32sValue([]int32{2, 3, 3, 1}))
		md.Set("tokenizer.ggml.bos_token_id", weights.Uint32Value(1))
		return md
	}
	if _, err := FromMetadata(base()); err != nil {
		t.Fatalf("base metadata: %v", err)
	}
	cases := []struct {
		name string
		edit func(md *weights.Metadata)
		want string
	}{
		{"no model", func(md *weights.Metadata) { md.Delete("tokenizer.ggml.model") }, "no tokenizer.ggml.model"},
		{"bad model", func(md *weights.Metadata) { md.Set("tokenizer.ggml.model", weights.StringValue("bert")) }, "\"bert\" is not supported"},
		{"no tokens", func(md *weights.Metadata) { md.Delete("tokenizer.ggml.tokens") }, "tokenizer.ggml.tokens\": missing"},
		{"empty tokens", func(md *weights.Metadata) { md.Set("tokenizer.ggml.tokens", weights.StringsValue(nil)) }, "holds 0 tokens"},
		{"tokens wrong type", func(md *weights.Metadata) { md.Set("tokenizer.ggml.tokens", weights.Int32sValue([]int32{1})) }, "want a string array"},
		{"no scores", func(md *weights.Metadata) { md.Delete("tokenizer.ggml.scores") }, "needs tokenizer.ggml.scores"},
		{"short scores", func(md *weights.Metadata) { md.Set("tokenizer.ggml.scores", weights.Float32sValue([]float32{0})) }, "scores has 1 entries for 4"},
		{"short types", func(md *weights.Metadata) { md.Set("tokenizer.ggml.token_type", weights.Int32sValue([]int32{1})) }, "token_type has 1 entries for 4"},
		{"bos out of range", func(md *weights.Metadata) { md.Set("tokenizer.ggml.bos_token_id", weights.Uint32Value(9)) }, "bos_token_id = 9 is outside"},
		{"bad pre", func(md *weights.Metadata) {
			md.Set("tokenizer.ggml.model", weights.StringValue("gpt2"))
			md.Set("tokenizer.ggml.pre", weights.StringValue("llama3"))
		}, "pre-tokenizer \"llama3\""},
		{"bad merge", func(md *weights.Metadata) {
			md.Set("tokenizer.ggml.model", weights.StringValue("gpt2"))
			md.Set("tokenizer.ggml.merges", weights.StringsValue([]string{"ab"}))
		}, "merges[0] = \"ab\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			md := base()
			tc.edit(md)
			_, err := FromMetadata(md)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestNoByteFallback: a vocabulary without <0xNN> pieces maps unknown
// characters to <unk>, and without <unk> either it fails.
func TestNoByteFallback(t *testing.T) {
	md := &weights.Metadata{}
	md.Set("tokenizer.ggml.model", weights.StringValue("llama"))
	md.Set("tokenizer.ggml.tokens", weights.StringsValue([]string{"<unk>", "\u2581", "a", "\u2581a"}))
	md.Set("tokenizer.ggml.scores", weights.Float32sValue([]float32{0, -3, -2, -1}))
	md.Set("tokenizer.ggml.token_type", weights.Int32sValue([]int32{2, 1, 1, 1}))
	md.Set("tokenizer.ggml.unknown_token_id", weights.Uint32Value(0))
	tk, err := FromMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.Encode("a é a", EncodeOptions{})
	if err != nil || !reflect.DeepEqual(got, []int32{3, 1, 0, 3}) {
		t.Fatalf("got %v, %v; want [3 1 0 3]", got, err)
	}
	md.Delete("tokenizer.ggml.unknown_token_id")
	if tk, err = FromMetadata(md); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Encode("é", EncodeOptions{}); err == nil || !strings.Contains(err.Error(), "no piece") {
		t.Fatalf("got %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "the file is empty"},
		{"short", []byte("GG"), "cut short"},
		{"bad gguf", []byte("GGUF\x03\x00\x00\x00"), "load tokenizer"},
		{"not a tokenizer", []byte("\x00\x00\x00\x00garbage"), "llama2.c tokenizer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dir + "/" + tc.name
			if err := os.WriteFile(p, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(p); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Load(dir + "/missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	// A GGUF model without a vocabulary.
	md := &weights.Metadata{}
	md.Set("general.architecture", weights.StringValue("llama"))
	p := dir + "/novocab.gguf"
	if err := weights.WriteGGUF(p, md, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "no tokenizer.ggml.model") {
		t.Fatalf("got %v", err)
	}
}

// FuzzEncode: for valid UTF-8, Decode(Encode(s)) == s with the Llama
// vocabulary (the dummy-prefix space is dropped again by Decode; a literal
// U+2581 in s comes back as a space, since SentencePiece reads it as one)
// and with GPT-2's, and the streaming decoder agrees with Decode.
func FuzzEncode(f *testing.F) {
	for _, s := range sampleTexts(f) {
		f.Add(s)
	}
	tk := load(f, "ggml-vocab-llama-spm.gguf")
	gpt := load(f, "ggml-vocab-gpt-2.gguf")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			if _, err := tk.Encode(s, EncodeOptions{}); !errors.Is(err, ErrInvalidUTF8) {
				t.Fatalf("invalid UTF-8 accepted: %v", err)
			}
			return
		}
		for _, k := range []*Tokenizer{tk, gpt} {
			ids, err := k.Encode(s, EncodeOptions{AddBOS: true})
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			want := s
			if k.Kind() == SPM {
				want = strings.ReplaceAll(s, spaceMark, " ")
			}
			if got != want {
				t.Fatalf("%v: %q -> %v -> %q", k.Kind(), s, ids, got)
			}
			if st := streamDecode(t, k, ids); st != got {
				t.Fatalf("stream %q, Decode %q", st, got)
			}
		}
		if _, err := tk.Encode(s, EncodeOptions{ParseSpecial: true}); err != nil {
			t.Fatal(err)
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	for _, file := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "tok512.bin"} {
		b.Run(file, func(b *testing.B) {
			tk := load(b, file)
			text := strings.Join(sampleTexts(b), "\n")
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tk.Encode(text, EncodeOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestConcurrentEncode: a Tokenizer is shared by many requests; run with -race.
func TestConcurrentEncode(t *testing.T) {
	tk := load(t, "ggml-vocab-llama-spm.gguf")
	vs := readVectors(t, "ggml-vocab-llama-spm.gguf")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, v := range vs {
				got, err := tk.Encode(v.in, EncodeOptions{})
				if err == nil && len(got)+len(v.out) > 0 && !reflect.DeepEqual(got, v.out) {
					err = fmt.Errorf("%q: got %v, want %v", v.in, got, v.out)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestFingerprint: the two spellings of each real vocabulary (llama2.c
// tokenizer.bin and GGUF keys) have one fingerprint; different
// vocabularies have different ones.
func TestFingerprint(t *testing.T) {
	load := func(name string) *Tokenizer {
		t.Helper()
		tok, err := Load(testutil.Model(t, name))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tok512, stories := load("tok512.bin"), load("stories260K.gguf")
	llama2c, spm := load("tokenizer.bin"), load("ggml-vocab-llama-spm.gguf")
	gpt2 := load("ggml-vocab-gpt-2.gguf")
	if tok512.Fingerprint() != stories.Fingerprint() {
		t.Errorf("tok512.bin and stories260K.gguf hold one vocabulary but fingerprint %x and %x", tok512.Fingerprint(), stories.Fingerprint())
	}
	if llama2c.Fingerprint() != spm.Fingerprint() {
		t.Errorf("tokenizer.bin and ggml-vocab-llama-spm.gguf hold one vocabulary but fingerprint %x and %x", llama2c.Fingerprint(), spm.Fingerprint())
	}
	for _, pair := range [][2]*Tokenizer{{tok512, llama2c}, {spm, gpt2}, {tok512, gpt2}} {
		if pair[0].Fingerprint() == pair[1].Fingerprint() {
			t.Errorf("different vocabularies share fingerprint %x", pair[0].Fingerprint())
		}
	}
}

// TestForModel: a tokenizer file wins, a GGUF's own vocabulary is used
// without one, a llama2.c file without one is ErrNoVocabulary naming it,
// and a tokenizer of another size than the model's is refused.
func TestForModel(t *testing.T) {
	open := func(name string) *weights.File {
		f, err := weights.Open(testutil.Model(t, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	bin, gguf := open("llama2xs_model.bin"), open("stories260K.gguf")
	if tok, err := ForModel(bin, testutil.Model(t, "tok512.bin")); err != nil || tok.VocabSize() != 512 {
		t.Errorf("llama2.c with tok512.bin: %v", err)
	}
	if tok, err := ForModel(gguf, ""); err != nil || tok.VocabSize() != 512 {
		t.Errorf("GGUF's own vocabulary: %v", err)
	}
	if _, err := ForModel(bin, ""); !errors.Is(err, ErrNoVocabulary) || !strings.Contains(err.Error(), bin.Path) {
		t.Errorf("llama2.c alone: %v, want ErrNoVocabulary naming the file", err)
	}
	// A tokenizer of another size, either way round, does not belong.
	tiny := open("llama-2-tiny-random.gguf")
	for _, c := range []struct {
		f   *weights.File
		tok string
	}{{gguf, "tokenizer.bin"}, {bin, "tokenizer.bin"}, {tiny, "tok512.bin"}} {
		if _, err := ForModel(c.f, testutil.Model(t, c.tok)); !errors.Is(err, ErrWrongVocabulary) || !strings.Contains(err.Error(), c.f.Path) {
			t.Errorf("%s with %s: %v, want ErrWrongVocabulary naming the model", c.f.Path, c.tok, err)
		}
	}
}
