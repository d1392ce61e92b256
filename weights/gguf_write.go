package weights

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/internal/interrupt"
	"github.com/tandem-llm/tandem/internal/progress"
)

// Keys and tensor names tandem writes and reads for llama-architecture
// files; they are the ones llama.cpp's loader expects.
//
//	general.architecture                      string  "llama"
//	general.name                              string
//	general.alignment                         uint32  data alignment (default 32)
//	general.file_type                         uint32  FileType* (0 f32, 1 f16, 2 q4_0, 7 q8_0, 32 bf16)
//	llama.context_length                      uint32  training context
//	llama.embedding_length                    uint32  model width (dim)
//	llama.block_count                         uint32  layers
//	llama.feed_forward_length                 uint32  FFN hidden size
//	llama.attention.head_count                uint32
//	llama.attention.head_count_kv             uint32  grouped-query KV heads
//	llama.rope.dimension_count                uint32  rotated dims per head (= head size)
//	llama.rope.freq_base                      float32 RoPE theta (default 10000)
//	llama.attention.layer_norm_rms_epsilon    float32
//	tokenizer.ggml.model                      string  "llama" (SentencePiece BPE) or "gpt2"
//	tokenizer.ggml.tokens / scores / token_type / merges
//	tokenizer.ggml.bos_token_id / eos_token_id / unknown_token_id  uint32
//
// Tensors (GGML shape order, row length first): token_embd.weight
// [dim, vocab]; per layer N blk.N.attn_norm.weight [dim],
// blk.N.attn_q.weight [dim, dim], blk.N.attn_k.weight [dim, kv_dim],
// blk.N.attn_v.weight [dim, kv_dim], blk.N.attn_output.weight [dim, dim],
// blk.N.ffn_norm.weight [dim], blk.N.ffn_gate.weight [dim, ffn],
// blk.N.ffn_up.weight [dim, ffn], blk.N.ffn_down.weight [ffn, dim];
// output_norm.weight [dim]; output.weight [dim, vocab] (absent when the
// classifier is tied to the embedding).
const ggufVersion = 3

// TensorInfo declares a tensor before its data is written.
type TensorInfo struct {
	Name  string
	Type  DType
	Shape []uint64 // GGML order
}

// Bytes is the tensor's data size.
func (t TensorInfo) Bytes() (uint64, error) {
	if len(t.Shape) == 0 || len(t.Shape) > 4 {
		return 0, fmt.Errorf("tensor %q: %d dimensions (want 1 to 4)", t.Name, len(t.Shape))
	}
	if !t.Type.Known() {
		return 0, fmt.Errorf("tensor %q: unknown type %d", t.Name, uint32(t.Type))
	}
	row, err := t.Type.RowBytes(t.Shape[0])
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	size := mulChecked(append([]uint64{row}, t.Shape[1:]...)...)
	if size == 0 {
		return 0, fmt.Errorf("tensor %q: shape %v is empty or too large", t.Name, t.Shape)
	}
	return size, nil
}

// GGUFWriter streams a GGUF v3 file: the header goes out when it is
// created, then tensor data in declared order through Write, so a model
// of any size is written with constant memory.
type GGUFWriter struct {
	bw      *bufio.Writer
	tensors []TensorInfo
	sizes   []uint64
	align   uint64
	cur     int    // tensor being written
	done    uint64 // bytes of tensors[cur] written
	size    uint64 // the whole file's
	err     error
}

// NewGGUFWriter validates the tensor list and writes the header.
func NewGGUFWriter(w io.Writer, md *Metadata, tensors []TensorInfo) (*GGUFWriter, error) {
	g := &GGUFWriter{bw: bufio.NewWriterSize(w, 1<<20), tensors: tensors, align: DefaultAlignment}
	if md == nil {
		md = &Metadata{}
	}
	if v, ok := md.Get("general.alignment"); ok {
		a, _ := v.Uint()
		if v.Type != TypeUint32 || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("write gguf: general.alignment must be a power-of-two uint32, have %s %v", v.Type, v.V)
		}
		g.align = a
	}
	seen := make(map[string]bool, len(tensors))
	g.sizes = make([]uint64, len(tensors))
	for i, t := range tensors {
		if !utf8.ValidString(t.Name) || t.Name == "" {
			return nil, fmt.Errorf("write gguf: tensor %d: name %q is empty or not UTF-8", i, t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("write gguf: duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		size, err := t.Bytes()
		if err != nil {
			return nil, fmt.Errorf("write gguf: %w", err)
		}
		g.sizes[i] = size
	}

	var e encoder
	e.u32(GGUFMagic)
	e.u32(ggufVersion)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(md.Len()))
	for _, kv := range md.All() {
		if !utf8.ValidString(kv.Key) {
			return nil, fmt.Errorf("write gguf: metadata key %q is not UTF-8", kv.Key)
		}
		e.str(kv.Key)
		e.u32(uint32(kv.Value.Type))
		if err := e.value(kv.Value); err != nil {
			return nil, fmt.Errorf("write gguf: metadata key %q: %w", kv.Key, err)
		}
	}
	var off uint64
	for i, t := range tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off = alignUp(off+g.sizes[i], g.align)
	}
	e.pad(g.align)
	g.size = uint64(len(e.b)) + off // at most an alignment's padding over
	if _, err := g.bw.Write(e.b); err != nil {
		return nil, fmt.Errorf("write gguf: header: %w", err)
	}
	return g, nil
}

// Write appends tensor data; p may span tensor boundaries. Alignment
// padding between tensors is inserted here.
func (g *GGUFWriter) Write(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n := 0
	for len(p) > 0 {
		if g.cur >= len(g.tensors) {
			g.err = fmt.Errorf("write gguf: %d bytes more than the declared tensors hold", len(p))
			return n, g.err
		}
		k := min(uint64(len(p)), g.sizes[g.cur]-g.done)
		if _, err := g.bw.Write(p[:k]); err != nil {
			g.err = fmt.Errorf("write gguf: tensor %q: %w", g.tensors[g.cur].Name, err)
			return n, g.err
		}
		n += int(k)
		p = p[k:]
		g.done += k
		if g.done == g.sizes[g.cur] {
			if pad := alignUp(g.done, g.align) - g.done; pad > 0 {
				g.bw.Write(make([]byte, pad))
			}
			g.cur++
			g.done = 0
		}
	}
	return n, nil
}

// Next reports the index of the tensor the next Write goes to
// (len(tensors) when all are complete).
func (g *GGUFWriter) Next() int { return g.cur }

// Size is about how many bytes the whole file takes (to within the
// alignment), known once the header is written.
func (g *GGUFWriter) Size() uint64 { return g.size }

// Close flushes and checks that every declared tensor was written in full.
// It does not close the underlying writer.
func (g *GGUFWriter) Close() error {
	if g.err != nil {
		return g.err
	}
	if g.cur < len(g.tensors) {
		return fmt.Errorf("write gguf: tensor %q has %d of %d bytes (and %d tensors after it are missing)",
			g.tensors[g.cur].Name, g.done, g.sizes[g.cur], len(g.tensors)-g.cur-1)
	}
	if err := g.bw.Flush(); err != nil {
		return fmt.Errorf("write gguf: %w", err)
	}
	return nil
}

// WriteGGUF writes a GGUF file at path, calling data(i, w) to stream
// tensor i's bytes. The file appears under path only when complete
// (it is written beside it and renamed), so a failure loses nothing.
func WriteGGUF(path string, md *Metadata, tensors []TensorInfo, data func(i int, w io.Writer) error) (err error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("write gguf: %s is a directory; give a file name", path)
	}
	tmp, err := interrupt.CreateOutput(path) // a Ctrl-C leaves no half file
	if err != nil {
		return fmt.Errorf("write gguf: %w", err)
	}
	defer tmp.Discard() // nothing after the Commit
	g, err := NewGGUFWriter(tmp, md, tensors)
	if err != nil {
		return err
	}
	// A model larger than the disk filled it for hours before failing.
	if free, ok := diskFree(filepath.Dir(path)); ok && g.Size() > free {
		return fmt.Errorf("write gguf %s: the file takes %s and its file system has %s free; free some space or write it elsewhere",
			path, progress.Bytes(g.Size()), progress.Bytes(free))
	}
	for i := range tensors {
		if err := data(i, g); err != nil {
			return fmt.Errorf("write gguf %s: tensor %q: %w", path, tensors[i].Name, err)
		}
		if g.Next() != i+1 {
			return fmt.Errorf("write gguf %s: tensor %q: data callback wrote %d of %d bytes", path, tensors[i].Name, g.done, g.sizes[i])
		}
	}
	if err := g.Close(); err != nil {
		return err
	}
	if err := tmp.Commit(); err != nil {
		return fmt.Errorf("write gguf: %w", err)
	}
	return nil
}

// encoder builds the header in memory (headers are small next to data).
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) pad(a uint64) {
	for uint64(len(e.b))%a != 0 {
		e.b = append(e.b, 0)
	}
}

// value encodes v's payload (its type tag is written by the caller).
func (e *encoder) value(v Value) error {
	bad := func() error { return fmt.Errorf("value of type %s holds a Go %T", v.Type, v.V) }
	switch v.Type {
	case TypeUint8:
		x, ok := v.V.(uint8)
		if !ok {
			return bad()
		}
		e.u8(x)
	case TypeInt8:
		x, ok := v.V.(int8)
		if !ok {
			return bad()
		}
		e.u8(uint8(x))
	case TypeUint16:
		x, ok := v.V.(uint16)
		if !ok {
			return bad()
		}
		e.u16(x)
	case TypeInt16:
		x, ok := v.V.(int16)
		if !ok {
			return bad()
		}
		e.u16(uint16(x))
	case TypeUint32:
		x, ok := v.V.(uint32)
		if !ok {
			return bad()
		}
		e.u32(x)
	case TypeInt32:
		x, ok := v.V.(int32)
		if !ok {
			return bad()
		}
		e.u32(uint32(x))
	case TypeFloat32:
		x, ok := v.V.(float32)
		if !ok {
			return bad()
		}
		e.u32(math.Float32bits(x))
	case TypeUint64:
		x, ok := v.V.(uint64)
		if !ok {
			return bad()
		}
		e.u64(x)
	case TypeInt64:
		x, ok := v.V.(int64)
		if !ok {
			return bad()
		}
		e.u64(uint64(x))
	case TypeFloat64:
		x, ok := v.V.(float64)
		if !ok {
			return bad()
		}
		e.u64(math.Float64bits(x))
	case TypeBool:
		x, ok := v.V.(bool)
		if !ok {
			return bad()
		}
		if x {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case TypeString:
		x, ok := v.V.(string)
		if !ok {
			return bad()
		}
		e.str(x)
	case TypeArray:
		vs, ok := v.V.([]Value)
		if !ok {
			return bad()
		}
		e.u32(uint32(v.Elem))
		e.u64(uint64(len(vs)))
		for i, x := range vs {
			if x.Type != v.Elem {
				return fmt.Errorf("array of %s: element %d is %s", v.Elem, i, x.Type)
			}
			if err := e.value(x); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
	default:
		return fmt.Errorf("unknown value type %d", uint32(v.Type))
	}
	return nil
}

// general.file_type values, numbered as llama.cpp's LLAMA_FTYPE_*: the
// type most weight matrices have.
const (
	FileTypeAllF32 uint32 = 0
	FileTypeF16    uint32 = 1
	FileTypeQ4_0   uint32 = 2
	FileTypeQ8_0   uint32 = 7
	FileTypeQ4_K_M uint32 = 15
	FileTypeQ6_K   uint32 = 18
	FileTypeBF16   uint32 = 32
)

// FileTypeFor is the general.file_type of a model whose matrices are t.
func FileTypeFor(t DType) (uint32, bool) {
	switch t {
	case F32:
		return FileTypeAllF32, true
	case F16:
		return FileTypeF16, true
	case Q4_0:
		return FileTypeQ4_0, true
	case Q8_0:
		return FileTypeQ8_0, true
	case Q4_K:
		return FileTypeQ4_K_M, true
	case Q6_K:
		return FileTypeQ6_K, true
	case BF16:
		return FileTypeBF16, true
	}
	return 0, false
}
