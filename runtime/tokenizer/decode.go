package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Decode turns ids back into text. Control tokens (BOS, EOS) render as
// nothing. For vocabularies with a dummy prefix, the leading space of the
// first token that renders text is dropped when only control tokens come
// before it, so Decode(Encode(s)) == s for valid UTF-8 s encoded without
// ParseSpecial (except that SentencePiece reads a literal U+2581 "▁" in s
// as a space, and it decodes as one). Byte tokens that do not form valid UTF-8 become U+FFFD, one
// per byte (as utf8.DecodeRune reads them).
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	buf := make([]byte, 0, len(ids)*4)
	started := false
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.text) {
			return "", fmt.Errorf("tokenizer: decode: ids[%d] = %d: %w (vocabulary of %d tokens)", i, id, ErrUnknownToken, len(t.text))
		}
		b := t.text[id]
		if !started && len(b) > 0 {
			started = true
			b = t.stripPrefix(b)
		}
		buf = append(buf, b...)
	}
	return validText(buf), nil
}

func (t *Tokenizer) stripPrefix(b []byte) []byte {
	if t.kind == SPM && t.addSpacePrefix && b[0] == ' ' {
		return b[1:]
	}
	return b
}

// validText converts b to a string with each invalid byte as U+FFFD.
func validText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// Decoder turns a stream of ids into text as they are generated, holding
// back the bytes of a character that is not complete yet (byte-fallback
// tokens such as <0xE2> <0x96> <0x81> arrive one at a time). The text of
// Next calls followed by Flush equals Decode of all the ids.
//
// To decode a continuation, feed the prompt's ids first and discard what
// Next returns: that keeps the leading-space rule and partial characters
// right. A Decoder is not safe for concurrent use.
type Decoder struct {
	t       *Tokenizer
	pending []byte
	started bool
}

// DecodeAfter returns the text ids add to a sequence that begins with
// prompt: a generation's answer as a stream of it shows, the first piece's
// leading space kept (Decode of ids alone drops it, as at a text's start),
// and a character split across the boundary in the answer. Unknown ids
// are skipped, as Decoder.Next skips them.
func (t *Tokenizer) DecodeAfter(prompt, ids []int32) string {
	d := t.NewDecoder()
	for _, id := range prompt {
		d.Next(id)
	}
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Next(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// NewDecoder starts decoding a sequence from its first token.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Next adds one token and returns the text it completes, which may be "".
// Ids outside the vocabulary are ignored.
func (d *Decoder) Next(id int32) string {
	if id < 0 || int(id) >= len(d.t.text) {
		return ""
	}
	b := d.t.text[id]
	if len(b) == 0 {
		return ""
	}
	if !d.started {
		d.started = true
		b = d.t.stripPrefix(b)
	}
	d.pending = append(d.pending, b...)
	n := 0
	for n < len(d.pending) && utf8.FullRune(d.pending[n:]) {
		_, k := utf8.DecodeRune(d.pending[n:])
		n += k
	}
	if n == 0 {
		return ""
	}
	s := validText(d.pending[:n])
	d.pending = d.pending[:copy(d.pending, d.pending[n:])]
	return s
}

// Flush returns what is held back (an incomplete character, as U+FFFD per
// byte) and empties the decoder's buffer; the sequence continues.
func (d *Decoder) Flush() string {
	s := validText(d.pending)
	d.pending = d.pending[:0]
	return s
}

// Reset starts a new sequence.
func (d *Decoder) Reset() {
	d.pending = d.pending[:0]
	d.started = false
}
