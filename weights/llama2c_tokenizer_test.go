package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestLlama2CTokenizerMatchesGGUF checks that converting a tokenizer.bin
// gives exactly the tokenizer keys of the GGUF built from the same vocabulary.
func TestLlama2CTokenizerMatchesGGUF(t *testing.T) {
	cases := []struct {
		bin, gguf string
		n         int
		maxLen    int
	}{
		{"tok512.bin", "stories260K.gguf", 512, 7},
		{"tokenizer.bin", "ggml-vocab-llama-spm.gguf", 32000, 27},
		{"tokenizer.bin", "llama-2-tiny-random.gguf", 32000, 27},
	}
	for _, tc := range cases {
		t.Run(tc.bin+"/"+tc.gguf, func(t *testing.T) {
			v, err := OpenLlama2CTokenizer(testutil.Model(t, tc.bin))
			if err != nil {
				t.Fatal(err)
			}
			if len(v.Tokens) != tc.n || len(v.Scores) != tc.n || v.MaxTokenLen != tc.maxLen {
				t.Fatalf("got %d tokens, %d scores, max len %d; want %d, %d, %d", len(v.Tokens), len(v.Scores), v.MaxTokenLen, tc.n, tc.n, tc.maxLen)
			}
			ref, err := Open(testutil.Model(t, tc.gguf))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			var md Metadata
			v.SetMetadata(&md)
			for _, key := range []string{"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
				"tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"} {
				got, _ := md.Get(key)
				want, ok := ref.Metadata.Get(key)
				if !ok {
					t.Fatalf("%s lacks %s", tc.gguf, key)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s differs from %s's", key, tc.gguf)
				}
			}
			// stories260K.gguf came from llama.cpp's llama2.c converter, which
			// also writes "no separator/padding" ids: every tokenizer key must match.
			if tc.gguf == "stories260K.gguf" {
				for _, kv := range ref.Metadata.All() {
					if !strings.HasPrefix(kv.Key, "tokenizer.") {
						continue
					}
					if got, _ := md.Get(kv.Key); !reflect.DeepEqual(got, kv.Value) {
						t.Errorf("%s: got %v, want %v", kv.Key, got, kv.Value)
					}
				}
			}
		})
	}
}

func TestLlama2CTokenizerKnownTokens(t *testing.T) {
	v, err := OpenLlama2CTokenizer(testutil.Model(t, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]struct {
		bin, gguf string
		typ       int32
	}{
		0:     {"<unk>", "<unk>", TokenUnknown},
		1:     {"\n<s>\n", "<s>", TokenControl},
		2:     {"\n</s>\n", "</s>", TokenControl},
		3:     {"<0x00>", "<0x00>", TokenByte},
		13:    {"<0x0A>", "<0x0A>", TokenByte},
		258:   {"<0xFF>", "<0xFF>", TokenByte},
		259:   {"  ", "\u2581\u2581", TokenNormal},
		15043: {" Hello", "\u2581Hello", TokenNormal},
		29871: {" ", "\u2581", TokenNormal},
	}
	for id, w := range want {
		if v.Tokens[id] != w.bin || v.GGUFToken(id) != w.gguf || v.TokenType(id) != w.typ {
			t.Errorf("token %d: got %q/%q/%d, want %q/%q/%d", id, v.Tokens[id], v.GGUFToken(id), v.TokenType(id), w.bin, w.gguf, w.typ)
		}
	}
}

// tokBytes builds a tokenizer.bin image.
func tokBytes(maxLen int32, toks []string, scores []float32) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, maxLen)
	for i, s := range toks {
		binary.Write(&b, binary.LittleEndian, scores[i])
		binary.Write(&b, binary.LittleEndian, int32(len(s)))
		b.WriteString(s)
	}
	return b.Bytes()
}

func TestReadLlama2CTokenizer(t *testing.T) {
	good := tokBytes(3, []string{"xyz", "ab", "c"}, []float32{0, -1.5, 2})
	v, err := ReadLlama2CTokenizer(bytes.NewReader(good), int64(len(good)), "good.bin")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v, &Llama2CVocab{MaxTokenLen: 3, Tokens: []string{"xyz", "ab", "c"}, Scores: []float32{0, -1.5, 2}}) {
		t.Fatalf("got %+v", v)
	}
	if _, err := ReadLlama2CTokenizerN(bytes.NewReader(good), int64(len(good)), "good.bin", 3); err != nil {
		t.Fatalf("exact count: %v", err)
	}

	negLen := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(negLen[8:], uint32(0xFFFFFFFF))
	longLen := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(longLen[8:], 4)
	zeroMax := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(zeroMax, 0)
	hugeMax := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(hugeMax, math.MaxInt32)

	cases := []struct {
		name string
		data []byte
		n    int // expected vocab size; 0 = read to the end
		want string
	}{
		{"empty", nil, 0, "4 to"},
		{"short header", good[:3], 0, "4 to"},
		{"header only", good[:4], 0, "no tokens"},
		{"truncated score", good[:6], 0, "token 0 score"},
		{"truncated length", good[:10], 0, "token 0 length"},
		{"truncated bytes", good[:len(good)-1], 0, "token 2 bytes"},
		{"negative length", negLen, 0, "length -1 is out of range"},
		{"length over max", longLen, 0, "length 4 is out of range"},
		{"zero max length", zeroMax, 0, "max_token_length"},
		{"huge max length", hugeMax, 0, "max_token_length"},
		{"fewer tokens than vocab", good, 4, "file ends after 3 tokens but the model's vocab_size is 4"},
		{"more tokens than vocab", good, 2, "vocab_size 2 is smaller"},
		{"bad vocab size", good, -1, "vocab size -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.n != 0 {
				_, err = ReadLlama2CTokenizerN(bytes.NewReader(tc.data), int64(len(tc.data)), "bad.bin", tc.n)
			} else {
				_, err = ReadLlama2CTokenizer(bytes.NewReader(tc.data), int64(len(tc.data)), "bad.bin")
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.bin") {
				t.Fatalf("got error %v, want one naming bad.bin and containing %q", err, tc.want)
			}
		})
	}
	t.Run("short reader", func(t *testing.T) {
		_, err := ReadLlama2CTokenizer(bytes.NewReader(good[:5]), int64(len(good)), "short.bin")
		if err == nil || !strings.Contains(err.Error(), "short.bin") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		_, err := OpenLlama2CTokenizer("/nonexistent/tokenizer.bin")
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("got %v, want os.ErrNotExist", err)
		}
	})
}

// TestLlama2CTokenizerWrongModel pairs the 32k tokenizer with a 512-token
// model's vocab_size and the other way round.
func TestLlama2CTokenizerWrongModel(t *testing.T) {
	for _, tc := range []struct {
		file string
		n    int
	}{{"tokenizer.bin", 512}, {"tok512.bin", 32000}} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(testutil.Model(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ReadLlama2CTokenizerN(bytes.NewReader(data), int64(len(data)), tc.file, tc.n)
			if err == nil || !strings.Contains(err.Error(), "does not belong to this model") {
				t.Fatalf("got %v", err)
			}
		})
	}
}

func FuzzLlama2CTokenizer(f *testing.F) {
	f.Add(tokBytes(3, []string{"abc", "", "d"}, []float32{1, 2, 3}), 0)
	f.Add(tokBytes(5, []string{"\n<s>\n", " a"}, []float32{0, -1}), 2)
	if data, err := os.ReadFile(testutil.Model(f, "tok512.bin")); err == nil {
		f.Add(data, 512)
		f.Add(data[:len(data)/2], 0)
	}
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		var v *Llama2CVocab
		var err error
		if n > 0 {
			v, err = ReadLlama2CTokenizerN(bytes.NewReader(data), int64(len(data)), "fuzz.bin", n%70000+1)
		} else {
			v, err = ReadLlama2CTokenizer(bytes.NewReader(data), int64(len(data)), "fuzz.bin")
		}
		if err != nil {
			return
		}
		if len(v.Tokens) == 0 || len(v.Tokens) != len(v.Scores) {
			t.Fatalf("%d tokens, %d scores", len(v.Tokens), len(v.Scores))
		}
		var md Metadata
		v.SetMetadata(&md)
		if toks, err := md.Strings("tokenizer.ggml.tokens"); err != nil || len(toks) != len(v.Tokens) {
			t.Fatalf("metadata tokens: %v", err)
		}
	})
}
