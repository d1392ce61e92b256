package model

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tandem-llm/tandem/weights"
)

// Config holds a LLaMA model's hyperparameters.
type Config struct {
	Dim     int // embedding length
	Hidden  int // feed-forward length
	Layers  int
	Heads   int
	KVHeads int // grouped-query attention: Heads/KVHeads query heads share one KV head
	HeadDim int // Dim / Heads
	Vocab   int
	Context int // trained context length: positions must stay below it
	Eps     float32
	// RopeTheta is the RoPE frequency base (10000 unless the file says).
	RopeTheta float32
	// Tied is true when the output head is the token embedding.
	Tied bool
}

// KVDim is the width of one KV cache row per layer.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

// MaxDim bounds every hyperparameter a model file may give, so that the
// products used to size buffers cannot overflow; it is far above any real
// model. Tools that write models refuse more.
const MaxDim = 1 << 20

// ConfigFrom reads the hyperparameters of a llama-architecture file and
// checks them against the shapes of its tensors.
func ConfigFrom(f *weights.File) (Config, error) {
	var c Config
	if arch := f.Architecture(); arch != "llama" {
		return c, fmt.Errorf("%s: architecture %q is not supported; tandem runs llama-architecture models", f.Path, arch)
	}
	md := &f.Metadata
	req := func(key string) (int, error) {
		v, ok := md.Uint(key)
		if !ok {
			return 0, fmt.Errorf("%s: metadata key %s is missing or not a non-negative integer", f.Path, key)
		}
		if v == 0 || v > MaxDim {
			return 0, fmt.Errorf("%s: metadata %s = %d is outside 1..%d", f.Path, key, v, MaxDim)
		}
		return int(v), nil
	}
	var err error
	for _, p := range []struct {
		key string
		dst *int
	}{
		{"llama.embedding_length", &c.Dim},
		{"llama.feed_forward_length", &c.Hidden},
		{"llama.block_count", &c.Layers},
		{"llama.attention.head_count", &c.Heads},
		{"llama.context_length", &c.Context},
	} {
		if *p.dst, err = req(p.key); err != nil {
			return c, err
		}
	}
	c.KVHeads = c.Heads
	if _, ok := md.Get("llama.attention.head_count_kv"); ok {
		if c.KVHeads, err = req("llama.attention.head_count_kv"); err != nil {
			return c, err
		}
	}
	if c.Dim%c.Heads != 0 {
		return c, fmt.Errorf("%s: embedding length %d is not a multiple of the head count %d", f.Path, c.Dim, c.Heads)
	}
	if c.Heads%c.KVHeads != 0 {
		return c, fmt.Errorf("%s: head count %d is not a multiple of the KV head count %d", f.Path, c.Heads, c.KVHeads)
	}
	c.HeadDim = c.Dim / c.Heads
	if c.HeadDim%2 != 0 {
		return c, fmt.Errorf("%s: head dimension %d is odd; RoPE rotates pairs", f.Path, c.HeadDim)
	}
	if _, ok := md.Get("llama.rope.dimension_count"); ok {
		rd, err := req("llama.rope.dimension_count")
		if err != nil {
			return c, err
		}
		if rd != c.HeadDim {
			return c, fmt.Errorf("%s: llama.rope.dimension_count = %d but the head dimension is %d; partial RoPE is not supported", f.Path, rd, c.HeadDim)
		}
	}
	c.Eps = 1e-5
	if v, ok := md.Get("llama.attention.layer_norm_rms_epsilon"); ok {
		e, ok := v.Float()
		if !ok || !(e > 0 && e < 1) {
			return c, fmt.Errorf("%s: llama.attention.layer_norm_rms_epsilon = %v, want a number in (0, 1)", f.Path, v.V)
		}
		c.Eps = float32(e)
	}
	c.RopeTheta = 10000
	if v, ok := md.Get("llama.rope.freq_base"); ok {
		th, ok := v.Float()
		if !ok || !(th > 1) || math.IsInf(th, 0) {
			return c, fmt.Errorf("%s: llama.rope.freq_base = %v, want a finite number above 1", f.Path, v.V)
		}
		c.RopeTheta = float32(th)
	}

	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		if len(f.Tensors) == 0 {
			return c, fmt.Errorf("%s has no tensors, only metadata (a vocabulary-only GGUF?): it can be a --tokenizer, not a model", f.Path)
		}
		return c, fmt.Errorf("%s: tensor token_embd.weight is missing", f.Path)
	}
	if len(emb.Shape) != 2 || emb.Shape[0] != uint64(c.Dim) {
		return c, fmt.Errorf("%s: tensor token_embd.weight has shape %v, want [%d vocab] (embedding length %d)", f.Path, emb.Shape, c.Dim, c.Dim)
	}
	if emb.Shape[1] == 0 || emb.Shape[1] > 1<<24 {
		return c, fmt.Errorf("%s: tensor token_embd.weight has a vocabulary of %d, want 1..%d", f.Path, emb.Shape[1], 1<<24)
	}
	c.Vocab = int(emb.Shape[1])
	if v, ok := md.Uint("llama.vocab_size"); ok && v != uint64(c.Vocab) {
		return c, fmt.Errorf("%s: llama.vocab_size = %d but token_embd.weight has %d rows", f.Path, v, c.Vocab)
	}
	_, hasOut := f.Tensor("output.weight")
	c.Tied = !hasOut
	// A block_count below the file's layers loaded the first layers
	// alone and generated other text without a word (llama.cpp refuses
	// such a file too).
	for _, t := range f.Tensors {
		rest, ok := strings.CutPrefix(t.Name, "blk.")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		if l, err := strconv.Atoi(num); err == nil && l >= c.Layers {
			return c, fmt.Errorf("%s: tensor %s belongs to layer %d, but llama.block_count = %d: the metadata does not match the tensors", f.Path, t.Name, l, c.Layers)
		}
	}
	return c, nil
}
