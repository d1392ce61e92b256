// Package train trains LLaMA-architecture models that runtime/model runs
// unchanged: a forward pass that keeps its activations, a hand-written
// backward pass, AdamW with warmup and cosine decay, gradient clipping,
// seeded data order, GGUF checkpoints with a training-state sidecar, and
// distillation of a draft from any target model.
//
// The numeric code is generic over float32 (training, with the kernels
// package's matmul) and float64 (gradient checks against finite
// differences, in pure Go), so the checks test the very code that trains.
package train

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// Float is the element type of parameters and activations.
type Float interface{ float32 | float64 }

// Tensor is one named parameter tensor: a view into Params.Data.
type Tensor[T Float] struct {
	Name  string
	Shape []uint64 // GGML order: Shape[0] is the row length
	Data  []T
	// Decay is true for matrices, which AdamW's weight decay shrinks;
	// norm gains are not decayed.
	Decay bool
}

// Layer holds one transformer block's parameters, matrices row-major as
// the GGUF file stores them (rows = outputs).
type Layer[T Float] struct {
	AttnNorm, Wq, Wk, Wv, Wo []T
	FFNNorm, Gate, Up, Down  []T
}

// Params is every parameter of a model in one flat slice, so the
// optimizer and gradient clipping run over it in one pass, with named
// views per tensor in file order.
type Params[T Float] struct {
	Cfg     model.Config
	Data    []T
	Tensors []Tensor[T]
	Emb     []T // token_embd: Vocab rows of Dim
	Layers  []Layer[T]
	OutNorm []T
	Out     []T // output head: Vocab rows of Dim (Emb when tied)
}

// CheckConfig validates a shape before anything is allocated, with
// errors that name the rule a shape breaks.
func CheckConfig(c model.Config) error {
	switch {
	case c.Dim <= 0 || c.Hidden <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Vocab <= 0 || c.Context <= 0:
		return fmt.Errorf("train: every dimension must be positive (dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, context %d)",
			c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.Vocab, c.Context)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("train: dim %d does not divide into %d heads; pick a dim that is a multiple of the head count", c.Dim, c.Heads)
	case (c.Dim/c.Heads)%2 != 0:
		return fmt.Errorf("train: head size %d (dim %d / %d heads) is odd; RoPE rotates pairs, so it must be even", c.Dim/c.Heads, c.Dim, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("train: %d KV heads do not divide %d heads; grouped-query attention needs heads to be a multiple of KV heads", c.KVHeads, c.Heads)
	case c.HeadDim != 0 && c.HeadDim != c.Dim/c.Heads:
		return fmt.Errorf("train: head dim %d is not dim %d / heads %d", c.HeadDim, c.Dim, c.Heads)
	case c.Dim > 1<<14 || c.Hidden > 1<<16 || c.Layers > 256 || c.Vocab > 1<<20 || c.Context > 1<<16:
		return fmt.Errorf("train: shape too large for the CPU trainer (dim %d, hidden %d, layers %d, vocab %d, context %d)",
			c.Dim, c.Hidden, c.Layers, c.Vocab, c.Context)
	}
	return nil
}

// ParseShape reads "dim,hidden,layers,heads,kvheads[,context]" into a
// Config with the given vocabulary; context defaults to defContext.
func ParseShape(s string, vocab, defContext int) (model.Config, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 5 && len(parts) != 6 {
		return model.Config{}, fmt.Errorf("shape %q: want dim,hidden,layers,heads,kvheads[,context] (the vocabulary comes from the tokenizer)", s)
	}
	v := []int{0, 0, 0, 0, 0, defContext}
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 {
			return model.Config{}, fmt.Errorf("shape %q: field %d (%q) must be a positive integer", s, i+1, p)
		}
		v[i] = n
	}
	c := model.Config{Dim: v[0], Hidden: v[1], Layers: v[2], Heads: v[3], KVHeads: v[4], Vocab: vocab, Context: v[5],
		Eps: 1e-5, RopeTheta: 10000, Tied: true}
	if err := CheckConfig(c); err != nil {
		return model.Config{}, fmt.Errorf("shape %q: %w", s, err)
	}
	c.HeadDim = c.Dim / c.Heads
	return c, nil
}

// ShapeString is the inverse of ParseShape.
func ShapeString(c model.Config) string {
	return fmt.Sprintf("%d,%d,%d,%d,%d,%d", c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.Context)
}

// CountParams is the number of parameters of a model of shape c.
func CountParams(c model.Config) int {
	kvd := c.KVHeads * (c.Dim / c.Heads)
	per := 2*c.Dim + 2*c.Dim*c.Dim + 2*kvd*c.Dim + 3*c.Dim*c.Hidden
	n := c.Vocab*c.Dim + c.Layers*per + c.Dim
	if !c.Tied {
		n += c.Vocab * c.Dim
	}
	return n
}

// NewParams allocates zeroed parameters of shape c (gradients and
// optimizer moments use the same layout).
func NewParams[T Float](c model.Config) (*Params[T], error) {
	if err := CheckConfig(c); err != nil {
		return nil, err
	}
	c.HeadDim = c.Dim / c.Heads
	if c.Eps == 0 {
		c.Eps = 1e-5
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	p := &Params[T]{Cfg: c, Data: make([]T, CountParams(c))}
	off := 0
	add := func(name string, decay bool, shape ...int) []T {
		n := 1
		sh := make([]uint64, len(shape))
		for i, d := range shape {
			n *= d
			sh[i] = uint64(d)
		}
		v := p.Data[off : off+n : off+n]
		off += n
		p.Tensors = append(p.Tensors, Tensor[T]{Name: name, Shape: sh, Data: v, Decay: decay})
		return v
	}
	kvd := c.KVHeads * c.HeadDim
	p.Emb = add("token_embd.weight", true, c.Dim, c.Vocab)
	p.Layers = make([]Layer[T], c.Layers)
	for i := range p.Layers {
		L := &p.Layers[i]
		pre := fmt.Sprintf("blk.%d.", i)
		L.AttnNorm = add(pre+"attn_norm.weight", false, c.Dim)
		L.Wq = add(pre+"attn_q.weight", true, c.Dim, c.Dim)
		L.Wk = add(pre+"attn_k.weight", true, c.Dim, kvd)
		L.Wv = add(pre+"attn_v.weight", true, c.Dim, kvd)
		L.Wo = add(pre+"attn_output.weight", true, c.Dim, c.Dim)
		L.FFNNorm = add(pre+"ffn_norm.weight", false, c.Dim)
		L.Gate = add(pre+"ffn_gate.weight", true, c.Dim, c.Hidden)
		L.Up = add(pre+"ffn_up.weight", true, c.Dim, c.Hidden)
		L.Down = add(pre+"ffn_down.weight", true, c.Hidden, c.Dim)
	}
	p.OutNorm = add("output_norm.weight", false, c.Dim)
	if c.Tied {
		p.Out = p.Emb
	} else {
		p.Out = add("output.weight", true, c.Dim, c.Vocab)
	}
	if off != len(p.Data) {
		panic(fmt.Sprintf("train: parameter layout covers %d of %d values", off, len(p.Data)))
	}
	return p, nil
}

// Init fills the parameters as small LLaMA/GPT-2 training runs do: norm
// gains 1, matrices normal with standard deviation 0.02, and the two
// projections that write into the residual stream (attn_output,
// ffn_down) scaled by 1/sqrt(2·layers) so the residual's variance does
// not grow with depth. The same seed gives the same values.
func (p *Params[T]) Init(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x7472616e)) // "tran"
	resid := 0.02 / math.Sqrt(2*float64(p.Cfg.Layers))
	for _, t := range p.Tensors {
		switch {
		case len(t.Shape) == 1:
			for i := range t.Data {
				t.Data[i] = 1
			}
		default:
			std := 0.02
			if strings.HasSuffix(t.Name, "attn_output.weight") || strings.HasSuffix(t.Name, "ffn_down.weight") {
				std = resid
			}
			for i := range t.Data {
				t.Data[i] = T(rng.NormFloat64() * std)
			}
		}
	}
}

// Tensor returns the named tensor.
func (p *Params[T]) Tensor(name string) (*Tensor[T], bool) {
	for i := range p.Tensors {
		if p.Tensors[i].Name == name {
			return &p.Tensors[i], true
		}
	}
	return nil, false
}

// CopyFrom copies q's values into p (same shape).
func (p *Params[T]) CopyFrom(q *Params[T]) {
	copy(p.Data, q.Data)
}

// Zero clears every value (gradients before a step).
func (p *Params[T]) Zero() {
	clear(p.Data)
}

// ConfigFromFile reads a model file's shape as the trainer needs it.
func ConfigFromFile(f *weights.File) (model.Config, error) {
	c, err := model.ConfigFrom(f)
	if err != nil {
		return c, err
	}
	return c, CheckConfig(c)
}

// LoadParams reads every parameter of a llama model file (any tensor type
// tandem can dequantize) into float parameters: to resume training, to
// start from a trained model, or to compare the trainer with the runtime.
func LoadParams[T Float](f *weights.File) (*Params[T], error) {
	c, err := ConfigFromFile(f)
	if err != nil {
		return nil, err
	}
	p, err := NewParams[T](c)
	if err != nil {
		return nil, err
	}
	var buf []float32
	for _, t := range p.Tensors {
		ft, err := f.TensorShaped(t.Name, t.Shape...)
		if err != nil {
			return nil, fmt.Errorf("train: load %s: %w", f.Path, err)
		}
		if ft.Data == nil {
			return nil, fmt.Errorf("train: load %s: tensor %s has no mapped data (open the file with weights.Open)", f.Path, t.Name)
		}
		if cap(buf) < len(t.Data) {
			buf = make([]float32, len(t.Data))
		}
		buf = buf[:len(t.Data)]
		if err := weights.Dequantize(ft.Type, ft.Data, buf); err != nil {
			return nil, fmt.Errorf("train: load %s: tensor %s: %w", f.Path, t.Name, err)
		}
		for i, v := range buf {
			t.Data[i] = T(v)
		}
	}
	return p, nil
}
