package tokenizer

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/runtime/corpus"
	"github.com/tandem-llm/tandem/weights"
)

func stories(first, n int) []string {
	docs := make([]string, n)
	for i := range docs {
		docs[i] = corpus.Story(1, first+i)
	}
	return docs
}

// TestTrainedVocabulary: a vocabulary learned from the story corpus has
// exactly the size asked, loads with FromMetadata, round-trips held-out
// stories and text it never saw (through byte fallback), compresses more
// as it grows, and is the same on every run.
func TestTrainedVocabulary(t *testing.T) {
	n := 600
	if testing.Short() {
		n = 200
	}
	docs := stories(0, n)
	held := stories(100000, 50)
	var heldBytes int
	for _, d := range held {
		heldBytes += len(d)
	}
	prev := 0.0
	for _, size := range []int{384, 768} {
		md, err := Train(docs, TrainOptions{Vocab: size})
		if err != nil {
			t.Fatalf("vocab %d: %v", size, err)
		}
		tok, err := FromMetadata(md)
		if err != nil {
			t.Fatal(err)
		}
		if tok.VocabSize() != size || tok.BOS() != 1 || tok.EOS() != 2 || !tok.AddBOS() {
			t.Fatalf("vocab %d: size %d, bos %d, eos %d", size, tok.VocabSize(), tok.BOS(), tok.EOS())
		}
		var ids int
		for _, d := range append(held, "Ünïcode ✓ and\ttabs, 𝄞 and new\nlines", "") {
			enc, err := tok.Encode(d, EncodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			dec, err := tok.Decode(enc)
			if err != nil || dec != d {
				t.Fatalf("vocab %d: %q decodes to %q (%v)", size, d, dec, err)
			}
			ids += len(enc)
		}
		ratio := float64(heldBytes) / float64(ids)
		t.Logf("vocab %d: %.2f bytes per token on held-out stories", size, ratio)
		if ratio <= prev*1.2 {
			t.Errorf("vocab %d compresses to %.2f bytes/token, not clearly better than %.2f", size, ratio, prev)
		}
		prev = ratio
		again, _ := Train(docs, TrainOptions{Vocab: size})
		if !reflect.DeepEqual(md.All(), again.All()) {
			t.Errorf("vocab %d: two trainings on the same text differ", size)
		}
		// Pieces never span a word boundary: no ▁ inside a piece.
		toks, _ := md.Strings("tokenizer.ggml.tokens")
		for _, p := range toks {
			if i := strings.LastIndex(p, spaceMark); i > 0 {
				t.Errorf("piece %q has ▁ inside", p)
			}
		}
	}
}

func TestTrainErrors(t *testing.T) {
	if _, err := Train(stories(0, 3), TrainOptions{Vocab: 4000}); !errors.Is(err, ErrCorpusTooSmall) || !strings.Contains(err.Error(), "smaller vocabulary") {
		t.Errorf("3 stories for 4000 tokens: %v", err)
	}
	if _, err := Train(stories(0, 3), TrainOptions{Vocab: 200}); err == nil || !strings.Contains(err.Error(), "259") {
		t.Errorf("vocabulary below the byte tokens: %v", err)
	}
	if _, err := Train([]string{"", ""}, TrainOptions{Vocab: 300}); !errors.Is(err, ErrCorpusTooSmall) {
		t.Errorf("empty text: %v", err)
	}
	if _, err := Train([]string{"ok", "bad \xff"}, TrainOptions{Vocab: 300}); err == nil || !strings.Contains(err.Error(), "document 1") {
		t.Errorf("invalid UTF-8: %v", err)
	}
	// Many distinct characters: the rare ones fall back to bytes, and
	// the vocabulary still holds merges.
	var sb strings.Builder
	for r := rune(0x4e00); r < 0x4e00+400; r++ {
		sb.WriteString(strings.Repeat(string(r)+"ab ", 3))
	}
	md, err := Train([]string{sb.String()}, TrainOptions{Vocab: 300})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := FromMetadata(md)
	text := "丁ab 乏ab"
	ids, _ := tok.Encode(text, EncodeOptions{})
	if dec, _ := tok.Decode(ids); dec != text {
		t.Errorf("%q decodes to %q", text, dec)
	}
	if ty, _ := md.Int32s("tokenizer.ggml.token_type"); ty[3] != weights.TokenByte {
		t.Errorf("token 3 type %d, want byte", ty[3])
	}
}
