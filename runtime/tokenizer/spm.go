package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/weights"
)

// spaceMark is SentencePiece's visible space, U+2581 "▁".
const spaceMark = "\u2581"

func (t *Tokenizer) initSPM() {
	t.merge = make(map[string]int32, len(t.pieces))
	for i, p := range t.pieces {
		switch t.types[i] {
		// Only pieces SentencePiece would produce from text: control
		// tokens, <unk> and <0xNN> are never merged into from their text.
		case weights.TokenNormal, weights.TokenUserDefined:
			if _, dup := t.merge[p]; !dup {
				t.merge[p] = int32(i)
			}
		case weights.TokenByte:
			if b, ok := parseByteToken(p); ok && t.byteTok[b] < 0 {
				t.byteTok[b] = int32(i)
			}
		}
	}
}

// symbol is a run of text in a doubly linked list; merged-away symbols
// have start == end.
type symbol struct {
	start, end int32
	prev, next int32
}

type spmPair struct {
	score       float32
	left, right int32
	size        int32
}

// encodeSPM is SentencePiece BPE as llama.cpp runs it: start from UTF-8
// characters, repeatedly merge the adjacent pair whose concatenation is a
// piece with the highest score (ties: leftmost), then emit each symbol's
// piece, or byte-fallback tokens for characters that are not pieces.
func (t *Tokenizer) encodeSPM(out []int32, text string, prefix bool) ([]int32, error) {
	var sb strings.Builder
	sb.Grow(len(text) + len(text)/4 + 3)
	if prefix {
		sb.WriteString(spaceMark)
	}
	for i := 0; i < len(text); {
		j := strings.IndexByte(text[i:], ' ')
		if j < 0 {
			sb.WriteString(text[i:])
			break
		}
		sb.WriteString(text[i : i+j])
		sb.WriteString(spaceMark)
		i += j + 1
	}
	s := sb.String()

	syms := make([]symbol, 0, len(s))
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:])
		k := int32(len(syms))
		syms = append(syms, symbol{start: int32(i), end: int32(i + n), prev: k - 1, next: k + 1})
		i += n
	}
	syms[len(syms)-1].next = -1

	h := pairHeap[spmPair]{less: func(a, b spmPair) bool {
		return a.score > b.score || a.score == b.score && a.left < b.left
	}}
	h.items = make([]spmPair, 0, len(syms))
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if id, ok := t.merge[s[syms[l].start:syms[r].end]]; ok {
			h.push(spmPair{score: t.scores[id], left: l, right: r, size: syms[r].end - syms[l].start})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(int32(i-1), int32(i))
	}
	for h.len() > 0 {
		p := h.pop()
		l, r := &syms[p.left], &syms[p.right]
		// Skip pairs made stale by an earlier merge of either side.
		if l.start == l.end || r.start == r.end || l.next != p.right || r.end-l.start != p.size {
			continue
		}
		l.end = r.end
		r.start = r.end
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = p.left
		}
		try(l.prev, p.left)
		try(p.left, l.next)
	}

	for i := int32(0); i >= 0; i = syms[i].next {
		piece := s[syms[i].start:syms[i].end]
		if id, ok := t.merge[piece]; ok {
			out = append(out, id)
			continue
		}
		fallback := true
		for j := 0; j < len(piece); j++ {
			if t.byteTok[piece[j]] < 0 {
				fallback = false
				break
			}
		}
		switch {
		case fallback:
			for j := 0; j < len(piece); j++ {
				out = append(out, t.byteTok[piece[j]])
			}
		case t.unk >= 0:
			out = append(out, t.unk)
		default:
			return nil, fmt.Errorf("tokenizer: encode: %q has no piece, byte-fallback token or <unk> in this vocabulary", piece)
		}
	}
	return out, nil
}

// pairHeap is a binary heap ordered by less (the first element is the
// least). Typed rather than container/heap to avoid boxing each pair.
type pairHeap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *pairHeap[T]) len() int { return len(h.items) }

func (h *pairHeap[T]) push(x T) {
	h.items = append(h.items, x)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *pairHeap[T]) pop() T {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	for i := 0; ; {
		m, l, r := i, 2*i+1, 2*i+2
		if l < n && h.less(h.items[l], h.items[m]) {
			m = l
		}
		if r < n && h.less(h.items[r], h.items[m]) {
			m = r
		}
		if m == i {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
