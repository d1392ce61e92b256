package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// GPT-2 byte-level BPE maps every byte to a printable character so that
// pieces are text: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 onwards in byte order (space becomes "Ġ", U+0120).
var (
	byteRune [256]rune
	runeByte [512]int16 // -1 where a rune is no byte's image
)

func init() {
	for i := range runeByte {
		runeByte[i] = -1
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = next
			next++
		}
		runeByte[byteRune[b]] = int16(b)
	}
}

// bpeDecodePiece maps a byte-level piece back to its bytes; characters
// that are no byte's image are kept as they are.
func bpeDecodePiece(piece string) []byte {
	out := make([]byte, 0, len(piece))
	for _, r := range piece {
		if r >= 0 && r < rune(len(runeByte)) && runeByte[r] >= 0 {
			out = append(out, byte(runeByte[r]))
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}

func (t *Tokenizer) initBPE(merges []string) error {
	for b := range t.byteTok {
		if id, ok := t.ids[string(byteRune[b])]; ok {
			t.byteTok[b] = id
		}
	}
	t.bpeMerges = make(map[[2]int32]bpeMerge, len(merges))
	for rank, m := range merges {
		// The separator is the first space after the first character, so
		// a piece may itself start with a space.
		sp := -1
		if len(m) > 1 {
			if k := strings.IndexByte(m[1:], ' '); k >= 0 {
				sp = k + 1
			}
		}
		if sp < 0 {
			return fmt.Errorf("tokenizer: tokenizer.ggml.merges[%d] = %q is not two pieces separated by a space", rank, m)
		}
		a, b := m[:sp], m[sp+1:]
		ia, oka := t.ids[a]
		ib, okb := t.ids[b]
		iab, okab := t.ids[a+b]
		if !oka || !okb || !okab {
			continue // a merge whose pieces are not all tokens can never apply
		}
		key := [2]int32{ia, ib}
		if _, dup := t.bpeMerges[key]; !dup {
			t.bpeMerges[key] = bpeMerge{rank: int32(rank), id: iab}
		}
	}
	return nil
}

type bpePair struct {
	rank, id    int32 // merge rank and the merged token
	left, right int32
	lid, rid    int32 // the symbols' tokens when the pair was queued
}

// encodeBPE splits text like GPT-2's pre-tokenizer regex, then merges
// each word's bytes by merge rank (lowest first, ties leftmost).
func (t *Tokenizer) encodeBPE(out []int32, text string) ([]int32, error) {
	var (
		syms []symbol
		tok  []int32
		err  error
	)
	h := pairHeap[bpePair]{less: func(a, b bpePair) bool {
		return a.rank < b.rank || a.rank == b.rank && a.left < b.left
	}}
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if m, ok := t.bpeMerges[[2]int32{tok[l], tok[r]}]; ok {
			h.push(bpePair{rank: m.rank, id: m.id, left: l, right: r, lid: tok[l], rid: tok[r]})
		}
	}
	splitGPT2(text, func(off int, word string) bool {
		syms, tok, h.items = syms[:0], tok[:0], h.items[:0]
		for i := 0; i < len(word); i++ {
			id := t.byteTok[word[i]]
			if id < 0 {
				err = fmt.Errorf("tokenizer: encode: byte %#02x at offset %d has no token in this vocabulary", word[i], off+i)
				return false
			}
			k := int32(len(syms))
			syms = append(syms, symbol{start: int32(i), end: int32(i + 1), prev: k - 1, next: k + 1})
			tok = append(tok, id)
		}
		syms[len(syms)-1].next = -1
		for i := 1; i < len(syms); i++ {
			try(int32(i-1), int32(i))
		}
		for h.len() > 0 {
			p := h.pop()
			l, r := &syms[p.left], &syms[p.right]
			if l.start == l.end || r.start == r.end || l.next != p.right || tok[p.left] != p.lid || tok[p.right] != p.rid {
				continue
			}
			l.end = r.end
			r.start = r.end
			l.next = r.next
			if r.next >= 0 {
				syms[r.next].prev = p.left
			}
			tok[p.left] = p.id
			try(l.prev, p.left)
			try(p.left, l.next)
		}
		for i := int32(0); i >= 0; i = syms[i].next {
			out = append(out, tok[i])
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// splitGPT2 calls fn with each piece of GPT-2's pre-tokenizer,
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// written out by hand because Go's regexp has no lookahead. fn gets the
// piece's byte offset and stops the split by returning false.
func splitGPT2(s string, fn func(off int, piece string) bool) {
	for i := 0; i < len(s); {
		n := gpt2Piece(s, i)
		if !fn(i, s[i:i+n]) {
			return
		}
		i += n
	}
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isOther(r rune) bool  { return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r) }

// runOf returns the end of the run of runes satisfying class from i.
func runOf(s string, i int, class func(rune) bool) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !class(r) {
			break
		}
		i += n
	}
	return i
}

// gpt2Piece returns the length of the pre-tokenizer piece starting at i.
func gpt2Piece(s string, i int) int {
	if s[i] == '\'' && i+1 < len(s) {
		switch s[i+1] {
		case 's', 't', 'm', 'd':
			return 2
		}
		if i+2 < len(s) {
			switch s[i+1 : i+3] {
			case "re", "ve", "ll":
				return 3
			}
		}
	}
	j := i
	if s[j] == ' ' {
		j++
	}
	if j < len(s) {
		r, n := utf8.DecodeRuneInString(s[j:])
		switch {
		case isLetter(r):
			return runOf(s, j+n, isLetter) - i
		case isNumber(r):
			return runOf(s, j+n, isNumber) - i
		case !isSpace(r):
			return runOf(s, j+n, isOther) - i
		}
	}
	// A whitespace run. Followed by more text, its last character is left
	// for the next piece (\s+(?!\S)), unless it is the only one (\s+).
	end := runOf(s, i, isSpace)
	if end == i { // unreachable: every rune is space or not; kept so a piece is never empty
		_, n := utf8.DecodeRuneInString(s[i:])
		return n
	}
	if end == len(s) {
		return end - i
	}
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last - i
	}
	return end - i
}
