package train

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// ErrTooLittleData is returned (wrapped) when a token stream cannot fill
// one training window.
var ErrTooLittleData = errors.New("too little text")

// EncodeDocs tokenizes documents into one stream, each document as BOS,
// its tokens, EOS: the layout `tandem generate` expects (a prompt starts
// with BOS; generation stops at EOS).
func EncodeDocs(tok *tokenizer.Tokenizer, docs []string) ([]int32, error) {
	var out []int32
	for i, d := range docs {
		ids, err := tok.Encode(d, tokenizer.EncodeOptions{})
		if err != nil {
			return nil, fmt.Errorf("train: document %d: %w", i, err)
		}
		if tok.BOS() >= 0 {
			out = append(out, tok.BOS())
		}
		out = append(out, ids...)
		if tok.EOS() >= 0 {
			out = append(out, tok.EOS())
		}
	}
	return out, nil
}

// Windows cuts a token stream into training windows of T+1 tokens
// (T inputs, each with the next token as target), window k starting at
// token k·T, and serves them in an order shuffled per epoch from a seed.
// The window of a given step depends only on the seed and the step, so
// a resumed run sees exactly the data an uninterrupted one would.
type Windows struct {
	tokens []int32
	t      int
	stride int
	n      int
	seed   uint64
	epoch  int
	perm   []int
}

// NewWindows checks that tokens fill at least one window of t+1.
func NewWindows(tokens []int32, t int, seed uint64) (*Windows, error) {
	return NewWindowsStride(tokens, t, t, seed)
}

// NewWindowsStride is NewWindows with windows starting every stride
// tokens: sampled sequences of exactly t+1 tokens use stride t+1, so no
// window spans two of them.
func NewWindowsStride(tokens []int32, t, stride int, seed uint64) (*Windows, error) {
	if t <= 0 || stride <= 0 {
		return nil, fmt.Errorf("train: window length %d and stride %d must be positive", t, stride)
	}
	if len(tokens) < t+1 {
		return nil, fmt.Errorf("train: the text has %d tokens, fewer than one window of %d (context %d + 1); give more text or a shorter context: %w",
			len(tokens), t+1, t, ErrTooLittleData)
	}
	return &Windows{tokens: tokens, t: t, stride: stride, n: (len(tokens)-t-1)/stride + 1, seed: seed, epoch: -1}, nil
}

// Len is the number of windows in one epoch.
func (w *Windows) Len() int { return w.n }

// Tokens is the number of tokens one epoch trains on.
func (w *Windows) Tokens() int { return w.n * w.t }

// window returns the k-th window of the global (multi-epoch) order.
func (w *Windows) window(g int) []int32 {
	ep := g / w.n
	if ep != w.epoch {
		rng := rand.New(rand.NewPCG(w.seed, uint64(ep)))
		w.perm = rng.Perm(w.n)
		w.epoch = ep
	}
	k := w.perm[g%w.n]
	return w.tokens[k*w.stride : k*w.stride+w.t+1]
}

// Batch fills b with the B windows of a step: global windows step·B to
// step·B+B−1.
func (w *Windows) Batch(step, B int, b *Batch) {
	b.B, b.T = B, w.t
	b.Tokens = grow32(b.Tokens, B*w.t)
	b.Targets = grow32(b.Targets, B*w.t)
	for i := range B {
		win := w.window(step*B + i)
		copy(b.Tokens[i*w.t:], win[:w.t])
		copy(b.Targets[i*w.t:], win[1:])
	}
}

// Sequential fills b with B sequences: windows first..first+count−1 in
// stream order (held-out evaluation must not depend on a seed), then,
// up to B, padding sequences without targets (so an evaluation batch has
// the training batch's shape and reuses its buffers).
func (w *Windows) Sequential(first, count, B int, b *Batch) {
	b.B, b.T = B, w.t
	b.Tokens = grow32(b.Tokens, B*w.t)
	b.Targets = grow32(b.Targets, B*w.t)
	for i := range B {
		k := first + min(i, count-1)
		win := w.tokens[k*w.stride : k*w.stride+w.t+1]
		copy(b.Tokens[i*w.t:], win[:w.t])
		if i < count {
			copy(b.Targets[i*w.t:], win[1:])
			continue
		}
		for j := range w.t {
			b.Targets[i*w.t+j] = -1
		}
	}
}

func grow32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}
