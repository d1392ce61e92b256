package weights

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Shape is the set of hyperparameters of a llama-architecture model.
type Shape struct {
	Name                                string
	Dim, Hidden, Layers, Heads, KVHeads int
	Vocab, Context                      int
}

// Shapes are real model shapes tandem can synthesize and benchmark.
var Shapes = map[string]Shape{
	"stories15m":     {Name: "stories15m", Dim: 288, Hidden: 768, Layers: 6, Heads: 6, KVHeads: 6, Vocab: 32000, Context: 256},
	"stories110m":    {Name: "stories110m", Dim: 768, Hidden: 2048, Layers: 12, Heads: 12, KVHeads: 12, Vocab: 32000, Context: 1024},
	"tinyllama-1.1b": {Name: "tinyllama-1.1b", Dim: 2048, Hidden: 5632, Layers: 22, Heads: 32, KVHeads: 4, Vocab: 32000, Context: 2048},
	"llama2-7b":      {Name: "llama2-7b", Dim: 4096, Hidden: 11008, Layers: 32, Heads: 32, KVHeads: 32, Vocab: 32000, Context: 4096},
}

// ShapeNames lists Shapes' keys in order.
func ShapeNames() []string {
	names := make([]string, 0, len(Shapes))
	for n := range Shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupShape finds a named shape.
func LookupShape(name string) (Shape, error) {
	s, ok := Shapes[strings.ToLower(name)]
	if !ok {
		return Shape{}, fmt.Errorf("unknown shape %q (known: %s)", name, strings.Join(ShapeNames(), ", "))
	}
	return s, nil
}

// dimNames name ParseDims' fields in order.
var dimNames = [...]string{"dim", "hidden", "layers", "heads", "kvheads", "vocab", "context"}

// ParseDims reads "dim,hidden,layers,heads,kvheads,vocab[,context]".
func ParseDims(s string) (Shape, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 6 && len(parts) != 7 {
		return Shape{}, fmt.Errorf("dims %q: want dim,hidden,layers,heads,kvheads,vocab[,context]", s)
	}
	v := make([]int, 7)
	v[6] = 2048
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 || n > 1<<24 {
			return Shape{}, fmt.Errorf("dims %q: %s %q must be a whole number from 1 to %d", s, dimNames[i], strings.TrimSpace(p), 1<<24)
		}
		v[i] = n
	}
	sh := Shape{Name: "custom", Dim: v[0], Hidden: v[1], Layers: v[2], Heads: v[3], KVHeads: v[4], Vocab: v[5], Context: v[6]}
	return sh, sh.Validate()
}

// Validate checks the divisibility rules of the llama architecture.
func (s Shape) Validate() error {
	switch {
	case s.Dim <= 0 || s.Hidden <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.Vocab <= 0 || s.Context <= 0:
		return fmt.Errorf("shape %s: every dimension must be positive: %+v", s.Name, s)
	case s.Dim%s.Heads != 0 || (s.Dim/s.Heads)%2 != 0:
		return fmt.Errorf("shape %s: dim %d is not heads %d times an even head size", s.Name, s.Dim, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("shape %s: kv heads %d do not divide heads %d", s.Name, s.KVHeads, s.Heads)
	}
	return nil
}

// KVDim is the width of the K and V projections.
func (s Shape) KVDim() int { return s.Dim / s.Heads * s.KVHeads }

// Tensors lists the tensors of a model of this shape in file order:
// matrices of type t (F16 where a row is not a multiple of t's block),
// norms in F32, untied output.
func (s Shape) Tensors(t DType) []TensorInfo {
	mat := func(name string, cols, rows int) TensorInfo {
		typ := t
		if cols%t.BlockSize() != 0 {
			typ = F16
		}
		return TensorInfo{Name: name, Type: typ, Shape: []uint64{uint64(cols), uint64(rows)}}
	}
	vec := func(name string) TensorInfo { return TensorInfo{Name: name, Type: F32, Shape: []uint64{uint64(s.Dim)}} }
	ts := []TensorInfo{mat("token_embd.weight", s.Dim, s.Vocab)}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			vec(p+"attn_norm.weight"),
			mat(p+"attn_q.weight", s.Dim, s.Dim),
			mat(p+"attn_k.weight", s.Dim, s.KVDim()),
			mat(p+"attn_v.weight", s.Dim, s.KVDim()),
			mat(p+"attn_output.weight", s.Dim, s.Dim),
			vec(p+"ffn_norm.weight"),
			mat(p+"ffn_gate.weight", s.Dim, s.Hidden),
			mat(p+"ffn_up.weight", s.Dim, s.Hidden),
			mat(p+"ffn_down.weight", s.Hidden, s.Dim),
		)
	}
	return append(ts, vec("output_norm.weight"), mat("output.weight", s.Dim, s.Vocab))
}

// Metadata returns the llama.* keys describing the shape.
func (s Shape) Metadata(name string, t DType) *Metadata {
	md := &Metadata{}
	ft, _ := FileTypeFor(t)
	md.Set("general.architecture", StringValue("llama"))
	md.Set("general.name", StringValue(name))
	md.Set("general.file_type", Uint32Value(ft))
	md.Set("llama.context_length", Uint32Value(uint32(s.Context)))
	md.Set("llama.embedding_length", Uint32Value(uint32(s.Dim)))
	md.Set("llama.block_count", Uint32Value(uint32(s.Layers)))
	md.Set("llama.feed_forward_length", Uint32Value(uint32(s.Hidden)))
	md.Set("llama.rope.dimension_count", Uint32Value(uint32(s.Dim/s.Heads)))
	md.Set("llama.attention.head_count", Uint32Value(uint32(s.Heads)))
	md.Set("llama.attention.head_count_kv", Uint32Value(uint32(s.KVHeads)))
	md.Set("llama.attention.layer_norm_rms_epsilon", Float32Value(1e-5))
	md.Set("llama.rope.freq_base", Float32Value(10000))
	return md
}
