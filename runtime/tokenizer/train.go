package tokenizer

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/weights"
)

// ErrCorpusTooSmall is returned (wrapped) by Train when the text cannot
// fill the requested vocabulary.
var ErrCorpusTooSmall = errors.New("corpus too small for the vocabulary")

// TrainOptions configures Train.
type TrainOptions struct {
	// Vocab is the vocabulary size, special and byte tokens included
	// (at least 259 + the characters kept).
	Vocab int
	// MinPairCount is the fewest occurrences a pair needs to be merged
	// (default 2: a piece seen once is memorising, not a vocabulary).
	MinPairCount int
	// Progress, when set, is called after each merge.
	Progress func(done, total int)
}

// Reserved ids of trained vocabularies, as in Llama's.
const (
	trainUnk = 0
	trainBOS = 1
	trainEOS = 2
	// byteBase is the id of <0x00>; <0xFF> is byteBase+255.
	byteBase = 3
)

// TrainReserved is the tokens a trained vocabulary holds before its first
// piece: <unk>, <s>, </s> and the 256 bytes. A vocabulary needs more.
const TrainReserved = byteBase + 256

// Train learns a SentencePiece-style BPE vocabulary with byte fallback
// from documents and returns it as GGUF tokenizer.ggml.* keys, which
// FromMetadata loads: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
// (any text encodes, whatever its characters), the corpus's characters,
// then one piece per merge, scored by merge order so that Encode applies
// the merges in the order they were learned.
//
// Text is split as the encoder sees it (spaces become ▁, a leading ▁ is
// added) into words: a ▁ with the run of letters and digits after it, or
// a run of other characters; merges never cross words. The result
// depends only on the documents (ties break by piece order).
func Train(docs []string, o TrainOptions) (*weights.Metadata, error) {
	if o.MinPairCount <= 0 {
		o.MinPairCount = 2
	}
	if o.Vocab <= TrainReserved {
		return nil, fmt.Errorf("tokenizer: train: a vocabulary of %d has no room for pieces; it needs more than %d (3 special and 256 byte tokens)", o.Vocab, TrainReserved)
	}
	words := map[string]int{}
	for i, d := range docs {
		if !utf8.ValidString(d) {
			return nil, fmt.Errorf("tokenizer: train: document %d is not valid UTF-8", i)
		}
		splitWords(d, words)
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("tokenizer: train: the text is empty: %w", ErrCorpusTooSmall)
	}

	// Characters by frequency. They take at most half the free slots;
	// rarer ones fall back to byte tokens.
	chars := map[rune]int{}
	for w, n := range words {
		for _, r := range w {
			chars[r] += n
		}
	}
	alphabet := make([]rune, 0, len(chars))
	for r := range chars {
		alphabet = append(alphabet, r)
	}
	sort.Slice(alphabet, func(i, j int) bool {
		a, b := alphabet[i], alphabet[j]
		return chars[a] > chars[b] || chars[a] == chars[b] && a < b
	})
	if keep := (o.Vocab - TrainReserved) / 2; len(alphabet) > keep {
		alphabet = alphabet[:keep]
	}

	t := &bpeTrainer{ids: map[string]int32{}}
	for range TrainReserved {
		t.pieces = append(t.pieces, "")
	}
	for _, r := range alphabet {
		t.add(string(r))
	}
	// Words as symbol ids; a character outside the alphabet is a
	// barrier no merge crosses (it encodes as bytes).
	keys := make([]string, 0, len(words))
	for w := range words {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	for _, w := range keys {
		var syms []int32
		for _, r := range w {
			id, ok := t.ids[string(r)]
			if !ok {
				id = -1
			}
			syms = append(syms, id)
		}
		t.words = append(t.words, trainWord{syms: syms, count: words[w]})
	}
	t.countPairs()
	merges := o.Vocab - len(t.pieces)
	for done := 0; done < merges; {
		p, n, ok := t.best()
		if !ok || n < o.MinPairCount {
			return nil, fmt.Errorf("tokenizer: train: the text yields %d pieces (pairs seen at least %d times) but a vocabulary of %d was asked; give more text or a smaller vocabulary: %w",
				len(t.pieces), o.MinPairCount, o.Vocab, ErrCorpusTooSmall)
		}
		if t.merge(p) {
			done++
			if o.Progress != nil {
				o.Progress(done, merges)
			}
		}
	}
	return t.metadata(len(alphabet)), nil
}

// splitWords adds the words of one document (as the SPM encoder sees it)
// to counts.
func splitWords(doc string, counts map[string]int) {
	s := spaceMark + strings.ReplaceAll(doc, " ", spaceMark)
	start := 0
	class := func(r rune) int {
		if unicode.IsLetter(r) || unicode.IsDigit(r) || r == '\'' {
			return 1
		}
		return 2
	}
	prev := 0 // class of the previous rune; 0 right after ▁
	for i, r := range s {
		switch {
		case string(r) == spaceMark:
			if i > start {
				counts[s[start:i]]++
			}
			start, prev = i, 0
			continue
		case prev != 0 && class(r) != prev:
			counts[s[start:i]]++
			start = i
		}
		prev = class(r)
	}
	if start < len(s) {
		counts[s[start:]]++
	}
}

type trainWord struct {
	syms  []int32
	count int
}

type pairKey [2]int32

type pairCount struct {
	pair pairKey
	n    int
}

// bpeTrainer holds the growing vocabulary and the words as symbol ids.
type bpeTrainer struct {
	pieces []string
	scores []float32 // of pieces after the fixed ones
	ids    map[string]int32
	words  []trainWord
	counts map[pairKey]int
	heap   pairHeap[pairCount]
}

func (t *bpeTrainer) add(piece string) int32 {
	id := int32(len(t.pieces))
	t.pieces = append(t.pieces, piece)
	t.ids[piece] = id
	return id
}

func (t *bpeTrainer) less(a, b pairCount) bool {
	if a.n != b.n {
		return a.n > b.n
	}
	if a.pair[0] != b.pair[0] {
		return a.pair[0] < b.pair[0]
	}
	return a.pair[1] < b.pair[1]
}

func (t *bpeTrainer) countPairs() {
	t.counts = map[pairKey]int{}
	for _, w := range t.words {
		for i := 0; i+1 < len(w.syms); i++ {
			if w.syms[i] >= 0 && w.syms[i+1] >= 0 {
				t.counts[pairKey{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
	}
	t.heap = pairHeap[pairCount]{less: t.less}
	keys := make([]pairKey, 0, len(t.counts))
	for k := range t.counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		t.heap.push(pairCount{k, t.counts[k]})
	}
}

// best pops the most frequent pair, skipping heap entries whose count
// changed since they were pushed.
func (t *bpeTrainer) best() (pairKey, int, bool) {
	for t.heap.len() > 0 {
		top := t.heap.pop()
		if n := t.counts[top.pair]; n == top.n && n > 0 {
			return top.pair, n, true
		}
	}
	return pairKey{}, 0, false
}

// merge joins every occurrence of p into one symbol, updating the pair
// counts of the words it touches. It reports whether the joined string
// is a new piece (two different pairs can spell the same string).
func (t *bpeTrainer) merge(p pairKey) bool {
	s := t.pieces[p[0]] + t.pieces[p[1]]
	id, exists := t.ids[s]
	if !exists {
		id = t.add(s)
		t.scores = append(t.scores, -float32(len(t.scores)+1))
	}
	changed := map[pairKey]bool{}
	bump := func(a, b int32, n int) {
		if a >= 0 && b >= 0 {
			k := pairKey{a, b}
			t.counts[k] += n
			changed[k] = true
		}
	}
	for wi := range t.words {
		w := &t.words[wi]
		if !contains(w.syms, p) {
			continue
		}
		for i := 0; i+1 < len(w.syms); i++ {
			bump(w.syms[i], w.syms[i+1], -w.count)
		}
		out := w.syms[:0]
		for i := 0; i < len(w.syms); i++ {
			if i+1 < len(w.syms) && w.syms[i] == p[0] && w.syms[i+1] == p[1] {
				out = append(out, id)
				i++
				continue
			}
			out = append(out, w.syms[i])
		}
		w.syms = out
		for i := 0; i+1 < len(w.syms); i++ {
			bump(w.syms[i], w.syms[i+1], w.count)
		}
	}
	keys := make([]pairKey, 0, len(changed))
	for k := range changed {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		if n := t.counts[k]; n > 0 {
			t.heap.push(pairCount{k, n})
		} else {
			delete(t.counts, k)
		}
	}
	return !exists
}

func contains(syms []int32, p pairKey) bool {
	for i := 0; i+1 < len(syms); i++ {
		if syms[i] == p[0] && syms[i+1] == p[1] {
			return true
		}
	}
	return false
}

// metadata writes the vocabulary as tokenizer.ggml.* keys.
func (t *bpeTrainer) metadata(nchars int) *weights.Metadata {
	n := len(t.pieces)
	toks := make([]string, n)
	scores := make([]float32, n)
	types := make([]int32, n)
	toks[trainUnk], types[trainUnk] = "<unk>", weights.TokenUnknown
	toks[trainBOS], types[trainBOS] = "<s>", weights.TokenControl
	toks[trainEOS], types[trainEOS] = "</s>", weights.TokenControl
	for b := range 256 {
		toks[byteBase+b], types[byteBase+b] = fmt.Sprintf("<0x%02X>", b), weights.TokenByte
	}
	first := byteBase + 256
	for i := first; i < n; i++ {
		toks[i], types[i] = t.pieces[i], weights.TokenNormal
		if i >= first+nchars {
			scores[i] = t.scores[i-first-nchars]
		}
	}
	md := &weights.Metadata{}
	md.Set("tokenizer.ggml.model", weights.StringValue("llama"))
	md.Set("tokenizer.ggml.tokens", weights.StringsValue(toks))
	md.Set("tokenizer.ggml.scores", weights.Float32sValue(scores))
	md.Set("tokenizer.ggml.token_type", weights.Int32sValue(types))
	md.Set("tokenizer.ggml.bos_token_id", weights.Uint32Value(trainBOS))
	md.Set("tokenizer.ggml.eos_token_id", weights.Uint32Value(trainEOS))
	md.Set("tokenizer.ggml.unknown_token_id", weights.Uint32Value(trainUnk))
	md.Set("tokenizer.ggml.add_bos_token", weights.BoolValue(true))
	md.Set("tokenizer.ggml.add_eos_token", weights.BoolValue(false))
	return md
}
