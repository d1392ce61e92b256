package weights

import (
	"fmt"
	"math/bits"
	"path/filepath"
	"strings"
)

// Llama2CHeader is the 7×int32 header of a llama2.c v0 .bin file.
type Llama2CHeader struct {
	Dim, HiddenDim, Layers, Heads, KVHeads, Vocab, SeqLen int
	Tied                                                  bool // classifier shares the embedding (vocab_size > 0 in the file)
}

const llama2CHeaderBytes = 7 * 4

// llama2CCutShort is the field of the error for a valid header over a
// file shorter than it describes.
const llama2CCutShort = "llama2.c file size"

// ParseLlama2C parses a llama2.c v0 fp32 model held in data and presents
// it as a llama-architecture file: GGUF tensor names and shapes, F32
// tensors viewing data in place, and the llama.* metadata a GGUF
// converter would write. The header must describe exactly len(data)
// bytes, which is what makes detection without a magic number safe.
func ParseLlama2C(data []byte, path string) (*File, error) {
	d := &decoder{b: data, path: path}
	var raw [7]int32
	names := [7]string{"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"}
	for i := range raw {
		u, err := d.u32("llama2.c header " + names[i])
		if err != nil {
			return nil, err
		}
		raw[i] = int32(u)
	}
	h := Llama2CHeader{Dim: int(raw[0]), HiddenDim: int(raw[1]), Layers: int(raw[2]), Heads: int(raw[3]),
		KVHeads: int(raw[4]), Vocab: int(raw[5]), SeqLen: int(raw[6]), Tied: raw[5] > 0}
	if h.Vocab < 0 {
		h.Vocab = -h.Vocab
	}
	for i, v := range raw {
		if v == 0 || (v < 0 && i != 5) || v > 1<<24 {
			return nil, &FormatError{Path: path, Offset: int64(4 * i), Field: "llama2.c header " + names[i],
				Msg: fmt.Sprintf("value %d is out of range (want 1 to %d)", v, 1<<24)}
		}
	}
	if h.Dim%h.Heads != 0 || (h.Dim/h.Heads)%2 != 0 {
		return nil, &FormatError{Path: path, Offset: 12, Field: "llama2.c header n_heads",
			Msg: fmt.Sprintf("dim %d is not n_heads %d times an even head size", h.Dim, h.Heads)}
	}
	if h.KVHeads > h.Heads || h.Heads%h.KVHeads != 0 {
		return nil, &FormatError{Path: path, Offset: 16, Field: "llama2.c header n_kv_heads",
			Msg: fmt.Sprintf("n_kv_heads %d does not divide n_heads %d", h.KVHeads, h.Heads)}
	}

	specs := h.tensors()
	total := uint64(llama2CHeaderBytes)
	for _, s := range specs {
		n := mulChecked(s.rows, s.cols, s.layers, 4)
		if n == 0 || total > 1<<62 {
			total = 0 // overflow
			break
		}
		total += n
	}
	if total != uint64(len(data)) {
		tied := "tied"
		if !h.Tied {
			tied = "untied"
		}
		want := fmt.Sprintf("a %d-byte file", total)
		if total == 0 {
			want = "more bytes than any file holds"
		}
		field, cut := "llama2.c header", ""
		if total > uint64(len(data)) {
			// A valid header over too few bytes: most likely a
			// download or copy that stopped, not another format.
			field, cut = llama2CCutShort, ": the file is cut short (an interrupted download or copy?)"
		}
		return nil, &FormatError{Path: path, Offset: 0, Field: field,
			Msg: fmt.Sprintf("dim=%d hidden_dim=%d n_layers=%d n_heads=%d n_kv_heads=%d vocab_size=%d seq_len=%d (%s classifier) describes %s, but the file has %d bytes%s",
				raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], tied, want, len(data), cut)}
	}
	off := uint64(llama2CHeaderBytes)
	tensors := make([]Tensor, 0, len(specs))
	for _, s := range specs {
		for l := uint64(0); l < s.layers; l++ {
			size := s.rows * s.cols * 4
			if s.name != "" {
				name := s.name
				if strings.Contains(name, "%d") {
					name = fmt.Sprintf(s.name, l)
				}
				shape := []uint64{s.cols, s.rows}
				if s.rows == 1 {
					shape = []uint64{s.cols}
				}
				tensors = append(tensors, Tensor{Name: name, Type: F32, Shape: shape, Offset: off, Size: size})
			}
			off += size
		}
	}
	for i := range tensors {
		t := &tensors[i]
		t.Data = data[t.Offset : t.Offset+t.Size : t.Offset+t.Size]
	}
	// Present tensors in GGUF order: embedding, then layer by layer.
	f := &File{Path: path, Format: FormatLlama2C, Alignment: 4, DataOffset: llama2CHeaderBytes, Size: int64(len(data))}
	f.Tensors = orderByLayer(tensors, h.Layers)
	h.setMetadata(&f.Metadata, path)
	if err := f.index(); err != nil {
		return nil, err
	}
	return f, nil
}

// llama2CTensor is one array of the llama2.c weight layout: layers
// consecutive row-major [rows × cols] float32 matrices. An empty name
// marks data tandem skips (the precomputed RoPE tables).
type llama2CTensor struct {
	name               string
	layers, rows, cols uint64
}

func (h Llama2CHeader) tensors() []llama2CTensor {
	L, dim, hid := uint64(h.Layers), uint64(h.Dim), uint64(h.HiddenDim)
	kv := uint64(h.Dim / h.Heads * h.KVHeads)
	half := uint64(h.Dim / h.Heads / 2)
	ts := []llama2CTensor{
		{"token_embd.weight", 1, uint64(h.Vocab), dim},
		{"blk.%d.attn_norm.weight", L, 1, dim},
		{"blk.%d.attn_q.weight", L, dim, dim},
		{"blk.%d.attn_k.weight", L, kv, dim},
		{"blk.%d.attn_v.weight", L, kv, dim},
		{"blk.%d.attn_output.weight", L, dim, dim},
		{"blk.%d.ffn_norm.weight", L, 1, dim},
		{"blk.%d.ffn_gate.weight", L, hid, dim}, // w1
		{"blk.%d.ffn_down.weight", L, dim, hid}, // w2
		{"blk.%d.ffn_up.weight", L, hid, dim},   // w3
		{"output_norm.weight", 1, 1, dim},
		{"", 1, uint64(h.SeqLen), half}, // freq_cis_real
		{"", 1, uint64(h.SeqLen), half}, // freq_cis_imag
	}
	if !h.Tied {
		ts = append(ts, llama2CTensor{"output.weight", 1, uint64(h.Vocab), dim})
	}
	return ts
}

func (h Llama2CHeader) setMetadata(md *Metadata, path string) {
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	md.Set("general.architecture", StringValue("llama"))
	md.Set("general.name", StringValue(name))
	md.Set("general.file_type", Uint32Value(FileTypeAllF32))
	md.Set("llama.context_length", Uint32Value(uint32(h.SeqLen)))
	md.Set("llama.embedding_length", Uint32Value(uint32(h.Dim)))
	md.Set("llama.block_count", Uint32Value(uint32(h.Layers)))
	md.Set("llama.feed_forward_length", Uint32Value(uint32(h.HiddenDim)))
	md.Set("llama.rope.dimension_count", Uint32Value(uint32(h.Dim/h.Heads)))
	md.Set("llama.attention.head_count", Uint32Value(uint32(h.Heads)))
	md.Set("llama.attention.head_count_kv", Uint32Value(uint32(h.KVHeads)))
	md.Set("llama.attention.layer_norm_rms_epsilon", Float32Value(1e-5))
	md.Set("llama.rope.freq_base", Float32Value(10000))
}

// orderByLayer puts token_embd first, each layer's tensors together in
// GGUF order, then the output tensors.
func orderByLayer(ts []Tensor, layers int) []Tensor {
	out := make([]Tensor, 0, len(ts))
	out = append(out, ts[0])
	for l := 0; l < layers; l++ {
		prefix := fmt.Sprintf("blk.%d.", l)
		for _, t := range ts {
			if strings.HasPrefix(t.Name, prefix) {
				out = append(out, t)
			}
		}
	}
	for _, t := range ts[1:] {
		if !strings.HasPrefix(t.Name, "blk.") {
			out = append(out, t)
		}
	}
	return out
}

// mulChecked multiplies and returns 0 on overflow past 2^62.
func mulChecked(xs ...uint64) uint64 {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, x)
		if hi != 0 || lo > 1<<62 {
			return 0
		}
		p = lo
	}
	return p
}
