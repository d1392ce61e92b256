package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tandem-llm/tandem/weights"
)

// ErrNoCheckpoint is returned (wrapped) by LoadCheckpoint when there is
// nothing to resume from.
var ErrNoCheckpoint = errors.New("no checkpoint")

// ModelMetadata is the GGUF metadata of a trained model: the llama.* keys
// runtime/model reads, general.* keys, and the vocabulary's
// tokenizer.ggml.* keys copied from vocab (so the file is
// self-contained).
func ModelMetadata(p *Params[float32], name string, typ weights.DType, vocab *weights.Metadata) *weights.Metadata {
	c := p.Cfg
	md := &weights.Metadata{}
	ft, _ := weights.FileTypeFor(typ)
	md.Set("general.architecture", weights.StringValue("llama"))
	md.Set("general.name", weights.StringValue(name))
	md.Set("general.file_type", weights.Uint32Value(ft))
	md.Set("llama.context_length", weights.Uint32Value(uint32(c.Context)))
	md.Set("llama.embedding_length", weights.Uint32Value(uint32(c.Dim)))
	md.Set("llama.block_count", weights.Uint32Value(uint32(c.Layers)))
	md.Set("llama.feed_forward_length", weights.Uint32Value(uint32(c.Hidden)))
	md.Set("llama.rope.dimension_count", weights.Uint32Value(uint32(c.HeadDim)))
	md.Set("llama.attention.head_count", weights.Uint32Value(uint32(c.Heads)))
	md.Set("llama.attention.head_count_kv", weights.Uint32Value(uint32(c.KVHeads)))
	md.Set("llama.attention.layer_norm_rms_epsilon", weights.Float32Value(c.Eps))
	md.Set("llama.rope.freq_base", weights.Float32Value(c.RopeTheta))
	md.Set("llama.vocab_size", weights.Uint32Value(uint32(c.Vocab)))
	if vocab != nil {
		for _, kv := range vocab.All() {
			if strings.HasPrefix(kv.Key, "tokenizer.") {
				md.Set(kv.Key, kv.Value)
			}
		}
	}
	return md
}

// WriteModel writes p as a GGUF model the runtime loads directly.
// Matrices become typ (F32, F16, BF16, Q8_0 or Q4_0; a matrix whose rows
// are not a multiple of typ's block is written F16); norm gains stay F32.
// The file appears at path only once complete.
func WriteModel(path string, p *Params[float32], md *weights.Metadata, typ weights.DType) error {
	switch typ {
	case weights.F32, weights.F16, weights.BF16, weights.Q8_0, weights.Q4_0:
	default:
		return fmt.Errorf("train: cannot write %s weights (choose f32, f16, bf16, q8_0 or q4_0)", typ)
	}
	infos := make([]weights.TensorInfo, len(p.Tensors))
	for i, t := range p.Tensors {
		to := weights.F32
		if len(t.Shape) == 2 {
			to = typ
			if t.Shape[0]%uint64(typ.BlockSize()) != 0 {
				to = weights.F16
			}
		}
		infos[i] = weights.TensorInfo{Name: t.Name, Type: to, Shape: t.Shape}
	}
	return writeTensors(path, md, infos, func(i int) []float32 { return p.Tensors[i].Data })
}

func writeTensors(path string, md *weights.Metadata, infos []weights.TensorInfo, data func(i int) []float32) error {
	var buf []byte
	return weights.WriteGGUF(path, md, infos, func(i int, w io.Writer) error {
		n, err := infos[i].Bytes()
		if err != nil {
			return err
		}
		if uint64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if err := weights.Quantize(infos[i].Type, data(i), buf); err != nil {
			return err
		}
		_, err = w.Write(buf)
		return err
	})
}

// State is what a checkpoint's sidecar records besides the optimizer
// moments: enough to continue a run exactly where it stopped and to
// refuse continuing it with different settings or data.
type State struct {
	Step     int     `json:"step"`
	Steps    int     `json:"steps"`
	Batch    int     `json:"batch"`
	SeqLen   int     `json:"seq_len"`
	Seed     uint64  `json:"seed"`
	Shape    string  `json:"shape"`
	DataHash string  `json:"data_hash"`
	LR       float64 `json:"lr"`
	MinLR    float64 `json:"min_lr"`
	Warmup   int     `json:"warmup"`
	Clip     float64 `json:"clip"`
	AdamT    int     `json:"adam_t"`
	Tokens   int64   `json:"tokens"`  // tokens trained on so far
	Seconds  float64 `json:"seconds"` // training time so far
	Distill  bool    `json:"distill,omitempty"`
}

// compatible reports the first setting that differs between a saved
// state and a new run's (the step and counters aside).
func (s State) compatible(o State) error {
	for _, c := range []struct {
		what string
		a, b any
	}{
		{"steps", s.Steps, o.Steps}, {"batch", s.Batch, o.Batch}, {"sequence length", s.SeqLen, o.SeqLen},
		{"seed", s.Seed, o.Seed}, {"shape", s.Shape, o.Shape}, {"training data", s.DataHash, o.DataHash},
		{"learning rate", s.LR, o.LR}, {"minimum learning rate", s.MinLR, o.MinLR}, {"warmup", s.Warmup, o.Warmup},
		{"clip", s.Clip, o.Clip}, {"distillation", s.Distill, o.Distill},
	} {
		if c.a != c.b {
			return fmt.Errorf("the checkpoint was made with %s %v, this run has %v; resume with the same settings or start afresh without --resume", c.what, c.a, c.b)
		}
	}
	return nil
}

// StatePath is the sidecar of checkpoint path.
func StatePath(path string) string { return path + ".state" }

// SaveCheckpoint writes the parameters as an F32 GGUF model at path
// (loadable by runtime/model as is) and the optimizer state beside it.
// Each file is replaced atomically; the model is written first, so a
// crash in between leaves a model one step ahead of its state, which
// LoadCheckpoint detects.
func SaveCheckpoint(path string, p *Params[float32], md *weights.Metadata, opt *AdamW, st State) error {
	mmd := &weights.Metadata{}
	for _, kv := range md.All() {
		mmd.Set(kv.Key, kv.Value)
	}
	mmd.Set("general.file_type", weights.Uint32Value(weights.FileTypeAllF32))
	mmd.Set("train.step", weights.Uint64Value(uint64(st.Step)))
	if err := WriteModel(path, p, mmd, weights.F32); err != nil {
		return fmt.Errorf("train: checkpoint: %w", err)
	}
	js, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("train: checkpoint: %w", err)
	}
	smd := &weights.Metadata{}
	smd.Set("general.architecture", weights.StringValue("tandem-train-state"))
	smd.Set("train.state", weights.StringValue(string(js)))
	infos := make([]weights.TensorInfo, 0, 2*len(p.Tensors))
	views := make([][]float32, 0, 2*len(p.Tensors))
	off := 0
	for _, t := range p.Tensors {
		n := len(t.Data)
		infos = append(infos,
			weights.TensorInfo{Name: "adam.m." + t.Name, Type: weights.F32, Shape: t.Shape},
			weights.TensorInfo{Name: "adam.v." + t.Name, Type: weights.F32, Shape: t.Shape})
		views = append(views, opt.M[off:off+n], opt.V[off:off+n])
		off += n
	}
	if err := writeTensors(StatePath(path), smd, infos, func(i int) []float32 { return views[i] }); err != nil {
		return fmt.Errorf("train: checkpoint state: %w", err)
	}
	return nil
}

// LoadCheckpoint reads a checkpoint written by SaveCheckpoint. It wraps
// ErrNoCheckpoint when neither file exists.
func LoadCheckpoint(path string) (*Params[float32], *AdamW, State, error) {
	var st State
	_, e1 := os.Stat(path)
	_, e2 := os.Stat(StatePath(path))
	if errors.Is(e1, os.ErrNotExist) && errors.Is(e2, os.ErrNotExist) {
		return nil, nil, st, fmt.Errorf("train: %s: %w", path, ErrNoCheckpoint)
	}
	f, err := weights.Open(path)
	if err != nil {
		return nil, nil, st, fmt.Errorf("train: checkpoint: %w", err)
	}
	defer f.Close()
	p, err := LoadParams[float32](f)
	if err != nil {
		return nil, nil, st, err
	}
	sf, err := weights.Open(StatePath(path))
	if err != nil {
		return nil, nil, st, fmt.Errorf("train: checkpoint state (the optimizer state beside the model): %w", err)
	}
	defer sf.Close()
	js, ok := sf.Metadata.String("train.state")
	if !ok {
		return nil, nil, st, fmt.Errorf("train: %s has no train.state key; it is not a tandem training state", sf.Path)
	}
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		return nil, nil, st, fmt.Errorf("train: %s: train.state: %w", sf.Path, err)
	}
	if step, ok := f.Metadata.Uint("train.step"); !ok || int(step) != st.Step {
		return nil, nil, st, fmt.Errorf("train: checkpoint %s is at step %d but its state %s at step %d (a crash between the two writes); delete both to start afresh",
			path, step, sf.Path, st.Step)
	}
	opt := NewAdamW(len(p.Data))
	opt.T = st.AdamT
	off := 0
	for _, t := range p.Tensors {
		n := len(t.Data)
		for _, mv := range []struct {
			name string
			dst  []float32
		}{{"adam.m." + t.Name, opt.M[off : off+n]}, {"adam.v." + t.Name, opt.V[off : off+n]}} {
			tt, err := sf.TensorShaped(mv.name, t.Shape...)
			if err != nil {
				return nil, nil, st, fmt.Errorf("train: checkpoint state: %w", err)
			}
			if tt.Type != weights.F32 || tt.Data == nil {
				return nil, nil, st, fmt.Errorf("train: checkpoint state: %s is %s, want mapped F32", mv.name, tt.Type)
			}
			if err := weights.Dequantize(weights.F32, tt.Data, mv.dst); err != nil {
				return nil, nil, st, fmt.Errorf("train: checkpoint state: %s: %w", mv.name, err)
			}
		}
		off += n
	}
	return p, opt, st, nil
}
