// Package tokenizer turns text into token ids and back for the two
// vocabulary kinds tandem's models use: SentencePiece-BPE as Llama uses it
// (llama.cpp's "llama"/SPM model) and GPT-2 byte-level BPE ("gpt2"). A
// Tokenizer is built from GGUF metadata (tokenizer.ggml.*) or a llama2.c
// tokenizer.bin and is safe for concurrent use.
package tokenizer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sort"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/weights"
)

// ErrInvalidUTF8 is returned (wrapped, with the byte offset) by Encode for
// text that is not valid UTF-8.
var ErrInvalidUTF8 = errors.New("text is not valid UTF-8")

// ErrUnknownToken is returned (wrapped) by Decode for an id outside the vocabulary.
var ErrUnknownToken = errors.New("token id outside the vocabulary")

// Kind is the tokenization algorithm.
type Kind int

const (
	// SPM is SentencePiece BPE with byte fallback (tokenizer.ggml.model "llama").
	SPM Kind = iota
	// BPE is GPT-2 byte-level BPE (tokenizer.ggml.model "gpt2").
	BPE
)

func (k Kind) String() string {
	if k == BPE {
		return "gpt2"
	}
	return "llama"
}

// EncodeOptions control Encode.
type EncodeOptions struct {
	AddBOS bool // put the BOS token first (when the vocabulary has one)
	// ParseSpecial matches the text of control and user-defined tokens
	// (e.g. "<s>", "<|endoftext|>") as those tokens; otherwise such text
	// is tokenized like any other text.
	ParseSpecial bool
}

// Tokenizer encodes and decodes text for one vocabulary.
type Tokenizer struct {
	kind   Kind
	pieces []string  // vocabulary strings as GGUF stores them
	scores []float32 // SPM merge priority
	types  []int32   // weights.Token* per id
	text   [][]byte  // bytes each token decodes to (before the leading-space rule)

	ids   map[string]int32 // every piece -> id (first id wins)
	merge map[string]int32 // SPM: pieces merges may produce (normal and user-defined)

	bos, eos, unk  int32 // -1 when absent
	addSpacePrefix bool  // SPM "dummy prefix": a space before the text
	addBOS         bool  // the vocabulary asks for BOS (tokenizer.ggml.add_bos_token)

	byteTok [256]int32 // SPM: <0xNN> ids; BPE: id of the byte's mapped char; -1 when absent

	bpeMerges map[[2]int32]bpeMerge

	specials map[byte][]int32 // first byte -> special token ids, longest first
}

type bpeMerge struct{ rank, id int32 }

// ErrNoVocabulary says a model file carries no vocabulary.
var ErrNoVocabulary = errors.New("no vocabulary in the model file (llama2.c models keep it in a separate tokenizer.bin)")

// ErrWrongVocabulary says a tokenizer has another number of tokens than
// the model it was given for has embedding rows.
var ErrWrongVocabulary = errors.New("the tokenizer and the model do not belong together")

// ForModel is the tokenizer for model file f: the tokenizer file at path
// when given, else f's own vocabulary (ErrNoVocabulary when it has none).
// A tokenizer whose size is not f's vocabulary (its token_embd.weight
// rows) is ErrWrongVocabulary: every request would fail on an id past
// the model's table, or the model's ids past the tokenizer's would
// decode to nothing.
func ForModel(f *weights.File, path string) (*Tokenizer, error) {
	var t *Tokenizer
	var err error
	switch _, own := f.Metadata.Get("tokenizer.ggml.tokens"); {
	case path != "":
		t, err = Load(path)
	case !own:
		return nil, fmt.Errorf("%s: %w", f.Path, ErrNoVocabulary)
	default:
		t, err = FromMetadata(&f.Metadata)
	}
	if err != nil {
		return nil, err
	}
	if emb, ok := f.Tensor("token_embd.weight"); ok && len(emb.Shape) == 2 && emb.Shape[1] != uint64(t.VocabSize()) {
		return nil, fmt.Errorf("%w: it has %d tokens but %s's vocabulary is %d", ErrWrongVocabulary, t.VocabSize(), f.Path, emb.Shape[1])
	}
	return t, nil
}

// FromMetadata builds a tokenizer from GGUF tokenizer.ggml.* keys.
func FromMetadata(md *weights.Metadata) (*Tokenizer, error) {
	model, ok := md.String("tokenizer.ggml.model")
	if !ok {
		return nil, fmt.Errorf("tokenizer: metadata has no tokenizer.ggml.model; the file carries no vocabulary (pass a tokenizer file)")
	}
	t := &Tokenizer{bos: -1, eos: -1, unk: -1}
	switch model {
	case "llama":
		t.kind = SPM
		t.addSpacePrefix = true
	case "gpt2":
		t.kind = BPE
		if pre, ok := md.String("tokenizer.ggml.pre"); ok {
			switch pre {
			case "default", "gpt2", "gpt-2":
			default:
				return nil, fmt.Errorf("tokenizer: pre-tokenizer %q is not supported (only GPT-2's)", pre)
			}
		}
	default:
		return nil, fmt.Errorf("tokenizer: tokenizer.ggml.model %q is not supported (want \"llama\" or \"gpt2\")", model)
	}
	var err error
	if t.pieces, err = md.Strings("tokenizer.ggml.tokens"); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	n := len(t.pieces)
	if n == 0 || n > 1<<24 {
		return nil, fmt.Errorf("tokenizer: tokenizer.ggml.tokens holds %d tokens (want 1 to %d)", n, 1<<24)
	}
	if _, ok := md.Get("tokenizer.ggml.scores"); ok {
		if t.scores, err = md.Float32s("tokenizer.ggml.scores"); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		if len(t.scores) != n {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.scores has %d entries for %d tokens", len(t.scores), n)
		}
	} else if t.kind == SPM {
		return nil, fmt.Errorf("tokenizer: a llama vocabulary needs tokenizer.ggml.scores, which is missing")
	}
	if _, ok := md.Get("tokenizer.ggml.token_type"); ok {
		if t.types, err = md.Int32s("tokenizer.ggml.token_type"); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		if len(t.types) != n {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.token_type has %d entries for %d tokens", len(t.types), n)
		}
	} else {
		t.types = make([]int32, n)
		for i := range t.types {
			t.types[i] = weights.TokenNormal
		}
	}
	for key, dst := range map[string]*int32{"bos": &t.bos, "eos": &t.eos, "unknown": &t.unk} {
		k := "tokenizer.ggml." + key + "_token_id"
		v, ok := md.Uint(k)
		if !ok || v == 0xFFFFFFFF {
			continue
		}
		if v >= uint64(n) {
			return nil, fmt.Errorf("tokenizer: %s = %d is outside the vocabulary of %d tokens", k, v, n)
		}
		*dst = int32(v)
	}
	if b, ok := md.Bool("tokenizer.ggml.add_space_prefix"); ok {
		t.addSpacePrefix = b
	}
	t.addBOS = t.kind == SPM
	if b, ok := md.Bool("tokenizer.ggml.add_bos_token"); ok {
		t.addBOS = b
	}

	t.text = make([][]byte, n)
	for i := range t.pieces {
		t.text[i] = tokenText(t.kind, t.pieces[i], t.types[i])
	}
	t.ids = make(map[string]int32, n)
	for i, p := range t.pieces {
		if _, dup := t.ids[p]; !dup {
			t.ids[p] = int32(i)
		}
	}
	for i := range t.byteTok {
		t.byteTok[i] = -1
	}
	if t.kind == SPM {
		t.initSPM()
	} else {
		var merges []string
		if _, ok := md.Get("tokenizer.ggml.merges"); ok {
			if merges, err = md.Strings("tokenizer.ggml.merges"); err != nil {
				return nil, fmt.Errorf("tokenizer: %w", err)
			}
		}
		if err := t.initBPE(merges); err != nil {
			return nil, err
		}
	}
	t.initSpecials()
	return t, nil
}

// FromLlama2C builds a SentencePiece tokenizer from a llama2.c tokenizer.bin.
func FromLlama2C(v *weights.Llama2CVocab) (*Tokenizer, error) {
	var md weights.Metadata
	v.SetMetadata(&md)
	if len(v.Tokens) < 3 {
		return nil, fmt.Errorf("tokenizer: llama2.c vocabulary has %d tokens; it needs at least <unk>, <s> and </s>", len(v.Tokens))
	}
	return FromMetadata(&md)
}

// Load reads a tokenizer from a GGUF file (a model or a vocabulary-only
// file) or a llama2.c tokenizer.bin.
func Load(path string) (*Tokenizer, error) {
	if err := weights.RegularFile(path, "a GGUF or a llama2.c tokenizer.bin"); err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	var magic [4]byte
	_, err = io.ReadFull(fh, magic[:])
	fh.Close()
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("load tokenizer %s: the file is empty or cut short (%w); want a GGUF or a llama2.c tokenizer.bin", path, err)
	case err != nil:
		return nil, fmt.Errorf("load tokenizer %s: reading the first 4 bytes: %w", path, err)
	}
	if binary.LittleEndian.Uint32(magic[:]) == weights.GGUFMagic {
		f, err := weights.Open(path)
		if err != nil {
			return nil, fmt.Errorf("load tokenizer: %w", err)
		}
		defer f.Close()
		t, err := FromMetadata(&f.Metadata)
		if err != nil {
			return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
		}
		return t, nil
	}
	v, err := weights.OpenLlama2CTokenizer(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer (not GGUF, so read as a llama2.c tokenizer.bin): %w", err)
	}
	return FromLlama2C(v)
}

// Kind is the tokenization algorithm.
func (t *Tokenizer) Kind() Kind { return t.kind }

// VocabSize is the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// BOS is the beginning-of-sequence id, -1 when the vocabulary has none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS is the end-of-sequence id, -1 when the vocabulary has none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// AddBOS reports whether the vocabulary asks for BOS before a prompt
// (tokenizer.ggml.add_bos_token; llama vocabularies default to true).
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// Piece is token id's vocabulary string as GGUF stores it (e.g. "▁Hello",
// "<0x0A>", "<s>"); "" for an id outside the vocabulary.
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// Type is token id's GGUF type (weights.TokenNormal, TokenControl, ...); 0
// for an id outside the vocabulary.
func (t *Tokenizer) Type(id int32) int32 {
	if id < 0 || int(id) >= len(t.types) {
		return 0
	}
	return t.types[id]
}

// Lookup returns the id of a vocabulary string.
func (t *Tokenizer) Lookup(piece string) (int32, bool) {
	id, ok := t.ids[piece]
	return id, ok
}

// Encode tokenizes text. SPM vocabularies put a space before the text
// (SentencePiece's dummy prefix) unless tokenizer.ggml.add_space_prefix is
// false; empty text gives no tokens (besides BOS).
func (t *Tokenizer) Encode(text string, opt EncodeOptions) ([]int32, error) {
	if !utf8.ValidString(text) {
		off := 0
		for off < len(text) {
			r, n := utf8.DecodeRuneInString(text[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return nil, fmt.Errorf("tokenizer: encode: byte offset %d (byte %#02x): %w", off, text[off], ErrInvalidUTF8)
	}
	out := make([]int32, 0, len(text)/3+2)
	if opt.AddBOS && t.bos >= 0 {
		out = append(out, t.bos)
	}
	if !opt.ParseSpecial || len(t.specials) == 0 {
		return t.encodeText(out, text, true)
	}
	// Text after a special token gets its own dummy prefix, as in llama.cpp.
	start, prefix := 0, true
	var err error
	for i := 0; i < len(text); {
		id, n := t.matchSpecial(text[i:])
		if n == 0 {
			i++
			continue
		}
		if out, err = t.encodeText(out, text[start:i], prefix); err != nil {
			return nil, err
		}
		out = append(out, id)
		i += n
		start, prefix = i, true
	}
	return t.encodeText(out, text[start:], prefix)
}

func (t *Tokenizer) encodeText(out []int32, text string, prefix bool) ([]int32, error) {
	if text == "" {
		return out, nil
	}
	if t.kind == SPM {
		return t.encodeSPM(out, text, prefix && t.addSpacePrefix)
	}
	return t.encodeBPE(out, text)
}

func (t *Tokenizer) initSpecials() {
	for i, typ := range t.types {
		if (typ == weights.TokenControl || typ == weights.TokenUserDefined) && t.pieces[i] != "" {
			if t.specials == nil {
				t.specials = make(map[byte][]int32)
			}
			b := t.pieces[i][0]
			t.specials[b] = append(t.specials[b], int32(i))
		}
	}
	for _, ids := range t.specials {
		sort.SliceStable(ids, func(a, b int) bool { return len(t.pieces[ids[a]]) > len(t.pieces[ids[b]]) })
	}
}

// matchSpecial returns the longest special token that text starts with.
func (t *Tokenizer) matchSpecial(text string) (int32, int) {
	for _, id := range t.specials[text[0]] {
		if p := t.pieces[id]; len(p) <= len(text) && text[:len(p)] == p {
			return id, len(p)
		}
	}
	return -1, 0
}

// Fingerprint identifies the vocabulary: a hash of its kind and of what
// every id stands for (its type and the bytes it decodes to). Two files
// that hold the same vocabulary in different spellings (llama2.c's
// tokenizer.bin and a GGUF's tokenizer.ggml.* keys) have the same
// fingerprint; a draft and a target must.
func (t *Tokenizer) Fingerprint() uint64 {
	h := fnv.New64a()
	var buf [8]byte
	put := func(v uint32) {
		binary.LittleEndian.PutUint32(buf[:4], v)
		h.Write(buf[:4])
	}
	put(uint32(t.kind))
	for id, piece := range t.pieces {
		// Control tokens are known by their id and type: llama2.c spells
		// BOS "\n<s>\n" where GGUF spells it "<s>".
		typ := t.types[id]
		text := tokenText(t.kind, piece, typ)
		put(uint32(typ))
		put(uint32(len(text)))
		h.Write(text)
	}
	return h.Sum64()
}

// tokenText is the bytes a token stands for in decoded text: control
// tokens render as nothing, byte tokens as their byte.
func tokenText(kind Kind, piece string, typ int32) []byte {
	switch typ {
	case weights.TokenControl, weights.TokenUnused:
		return nil
	case weights.TokenUserDefined:
		return []byte(piece)
	}
	if kind == SPM {
		switch typ {
		case weights.TokenUnknown:
			return []byte("\u2585") // llama.cpp renders <unk> as ▅
		case weights.TokenByte:
			if b, ok := parseByteToken(piece); ok {
				return []byte{b}
			}
		}
		return bytes.ReplaceAll([]byte(piece), []byte("\u2581"), []byte(" "))
	}
	return bpeDecodePiece(piece)
}

func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range []byte(s[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			b = b<<4 | (c - '0')
		case c >= 'A' && c <= 'F':
			b = b<<4 | (c - 'A' + 10)
		case c >= 'a' && c <= 'f':
			b = b<<4 | (c - 'a' + 10)
		default:
			return 0, false
		}
	}
	return b, true
}
