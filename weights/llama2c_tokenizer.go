package weights

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// Llama2CVocab is a llama2.c tokenizer.bin: the SentencePiece vocabulary
// of a llama2.c model, token strings as llama2.c stores them (spaces as
// ' ', BOS/EOS as "\n<s>\n" and "\n</s>\n").
type Llama2CVocab struct {
	MaxTokenLen int
	Tokens      []string
	Scores      []float32
}

// Limits that keep a corrupt file from asking for absurd allocations.
const (
	maxLlama2CTokenizerBytes = 1 << 28
	maxLlama2CTokenLen       = 1 << 16
	maxLlama2CVocab          = 1 << 24
)

// GGUF token types (tokenizer.ggml.token_type), as llama.cpp defines them.
const (
	TokenNormal      int32 = 1
	TokenUnknown     int32 = 2
	TokenControl     int32 = 3
	TokenUserDefined int32 = 4
	TokenUnused      int32 = 5
	TokenByte        int32 = 6
)

// OpenLlama2CTokenizer reads a tokenizer.bin file, taking every entry up
// to the end of the file.
func OpenLlama2CTokenizer(path string) (*Llama2CVocab, error) {
	if err := RegularFile(path, "a llama2.c tokenizer.bin"); err != nil {
		return nil, fmt.Errorf("open llama2.c tokenizer: %w", err)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open llama2.c tokenizer: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("open llama2.c tokenizer: %w", err)
	}
	return ReadLlama2CTokenizer(fh, st.Size(), path)
}

// ReadLlama2CTokenizer reads a tokenizer.bin of size bytes from r, taking
// entries until the end. The format does not store its token count, so
// when the model's vocab_size is known use ReadLlama2CTokenizerN, which
// also catches a tokenizer that belongs to another model.
func ReadLlama2CTokenizer(r io.ReaderAt, size int64, name string) (*Llama2CVocab, error) {
	return readLlama2CTokenizer(r, size, name, -1)
}

// ReadLlama2CTokenizerN reads exactly vocabSize entries (the vocab_size of
// the model header, as llama2.c does) and fails when the file holds fewer
// or more, which means the tokenizer does not belong to the model.
func ReadLlama2CTokenizerN(r io.ReaderAt, size int64, name string, vocabSize int) (*Llama2CVocab, error) {
	if vocabSize <= 0 || vocabSize > maxLlama2CVocab {
		return nil, fmt.Errorf("%s: llama2.c tokenizer: vocab size %d is out of range (want 1 to %d)", name, vocabSize, maxLlama2CVocab)
	}
	return readLlama2CTokenizer(r, size, name, vocabSize)
}

func readLlama2CTokenizer(r io.ReaderAt, size int64, name string, want int) (*Llama2CVocab, error) {
	if size < 4 || size > maxLlama2CTokenizerBytes {
		return nil, &FormatError{Path: name, Field: "llama2.c tokenizer size",
			Msg: fmt.Sprintf("file is %d bytes; a tokenizer.bin holds 4 to %d bytes", size, maxLlama2CTokenizerBytes)}
	}
	buf := make([]byte, size)
	if n, err := r.ReadAt(buf, 0); n != len(buf) {
		return nil, fmt.Errorf("%s: read llama2.c tokenizer: got %d of %d bytes: %w", name, n, size, err)
	}
	return parseLlama2CTokenizer(buf, name, want)
}

func parseLlama2CTokenizer(data []byte, name string, want int) (*Llama2CVocab, error) {
	d := &decoder{b: data, path: name}
	u, err := d.u32("max_token_length")
	if err != nil {
		return nil, err
	}
	maxLen := int32(u)
	if maxLen <= 0 || maxLen > maxLlama2CTokenLen {
		d.off = 0
		return nil, d.fail("max_token_length", "value %d is out of range (want 1 to %d); is this a llama2.c tokenizer.bin?", maxLen, maxLlama2CTokenLen)
	}
	v := &Llama2CVocab{MaxTokenLen: int(maxLen)}
	if want > 0 {
		v.Tokens = make([]string, 0, want)
		v.Scores = make([]float32, 0, want)
	}
	for i := 0; want < 0 && d.remaining() > 0 || i < want; i++ {
		if i >= maxLlama2CVocab {
			return nil, d.fail("token count", "more than %d tokens", maxLlama2CVocab)
		}
		if want > 0 && d.remaining() == 0 {
			return nil, d.fail(fmt.Sprintf("token %d", i),
				"file ends after %d tokens but the model's vocab_size is %d: the tokenizer does not belong to this model", i, want)
		}
		// Field names are built only on failure: a vocabulary has many
		// thousands of entries.
		if d.remaining() < 8 {
			field := "score"
			if d.remaining() >= 4 {
				field = "length"
			}
			return nil, d.fail(fmt.Sprintf("token %d %s", i, field), "file truncated: need 8 bytes, %d left (file size %d)", d.remaining(), len(d.b))
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(d.b[d.off:]))
		n := int32(binary.LittleEndian.Uint32(d.b[d.off+4:]))
		d.off += 8
		if n < 0 || n > maxLen {
			d.off -= 4
			return nil, d.fail(fmt.Sprintf("token %d length", i), "length %d is out of range (want 0 to max_token_length %d)", n, maxLen)
		}
		if d.remaining() < int(n) {
			return nil, d.fail(fmt.Sprintf("token %d bytes", i), "file truncated: need %d bytes, %d left (file size %d)", n, d.remaining(), len(d.b))
		}
		v.Tokens = append(v.Tokens, string(d.b[d.off:d.off+int(n)]))
		v.Scores = append(v.Scores, score)
		d.off += int(n)
	}
	if len(v.Tokens) == 0 {
		return nil, d.fail("tokens", "the file holds no tokens")
	}
	if d.remaining() > 0 {
		return nil, d.fail("end of file", "%d bytes follow token %d; the model's vocab_size %d is smaller than the tokenizer's: the tokenizer does not belong to this model",
			d.remaining(), len(v.Tokens)-1, want)
	}
	return v, nil
}

// GGUFToken returns token i as GGUF stores it: spaces as U+2581 and
// llama2.c's "\n<s>\n"/"\n</s>\n" as "<s>"/"</s>".
func (v *Llama2CVocab) GGUFToken(i int) string {
	switch s := v.Tokens[i]; s {
	case "\n<s>\n":
		return "<s>"
	case "\n</s>\n":
		return "</s>"
	default:
		return strings.ReplaceAll(s, " ", "\u2581")
	}
}

// TokenType classifies token i as llama.cpp's converter does for a
// SentencePiece vocabulary: <unk> unknown, <s> and </s> control, <0xNN>
// byte, everything else normal.
func (v *Llama2CVocab) TokenType(i int) int32 {
	s := v.GGUFToken(i)
	switch {
	case s == "<unk>":
		return TokenUnknown
	case s == "<s>" || s == "</s>":
		return TokenControl
	case isByteToken(s):
		return TokenByte
	}
	return TokenNormal
}

func isByteToken(s string) bool {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return false
	}
	hex := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }
	return hex(s[3]) && hex(s[4])
}

// SetMetadata writes the tokenizer.ggml.* keys a GGUF converter writes for
// this vocabulary (llama SentencePiece, BOS 1, EOS 2, UNK 0, no separator
// or padding token).
func (v *Llama2CVocab) SetMetadata(md *Metadata) {
	toks := make([]string, len(v.Tokens))
	types := make([]int32, len(v.Tokens))
	for i := range v.Tokens {
		toks[i] = v.GGUFToken(i)
		types[i] = v.TokenType(i)
	}
	md.Set("tokenizer.ggml.model", StringValue("llama"))
	md.Set("tokenizer.ggml.tokens", StringsValue(toks))
	md.Set("tokenizer.ggml.scores", Float32sValue(v.Scores))
	md.Set("tokenizer.ggml.token_type", Int32sValue(types))
	md.Set("tokenizer.ggml.unknown_token_id", Uint32Value(0))
	md.Set("tokenizer.ggml.bos_token_id", Uint32Value(1))
	md.Set("tokenizer.ggml.eos_token_id", Uint32Value(2))
	md.Set("tokenizer.ggml.seperator_token_id", Uint32Value(0xFFFFFFFF)) // sic: llama.cpp's key spelling
	md.Set("tokenizer.ggml.padding_token_id", Uint32Value(0xFFFFFFFF))
}
