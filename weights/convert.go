package weights

import (
	"fmt"
	"io"
)

// ConvertOptions controls Convert.
type ConvertOptions struct {
	// Type is what 2-D weight matrices become (F32, the zero value, keeps
	// float32; F16, BF16, Q8_0, Q4_0 quantize). 1-D tensors (norms) are
	// always written as F32: they are tiny and precision-critical.
	Type DType
	// Tokenizer holds tokenizer.ggml.* keys to merge into the metadata
	// (a llama2.c model carries none of its own).
	Tokenizer *Metadata
	// Fallback is told about each matrix whose row length is not a
	// multiple of Type's block size: it is written as F16 instead.
	Fallback func(tensor string, rowLen uint64, to DType)
	// Progress is called after each chunk with bytes done and total
	// (of the output tensor data).
	Progress func(done, total uint64)
}

// convertChunk bounds the float32 staging buffer (elements), so converting
// a 7B model needs a few MiB, not the model.
const convertChunk = 1 << 20

// ConvertPlan returns the metadata and tensor list Convert writes.
func ConvertPlan(src *File, opt ConvertOptions) (*Metadata, []TensorInfo, error) {
	if _, ok := FileTypeFor(opt.Type); !ok || !canQuantize(opt.Type) {
		return nil, nil, fmt.Errorf("convert: cannot write %s weights (choose f32, f16, bf16, q8_0 or q4_0)", opt.Type)
	}
	md := &Metadata{}
	for _, kv := range src.Metadata.All() {
		md.Set(kv.Key, kv.Value)
	}
	ft, _ := FileTypeFor(opt.Type)
	md.Set("general.file_type", Uint32Value(ft))
	if opt.Tokenizer != nil {
		for _, kv := range opt.Tokenizer.All() {
			md.Set(kv.Key, kv.Value)
		}
	}
	infos := make([]TensorInfo, len(src.Tensors))
	for i, t := range src.Tensors {
		to := F32
		if len(t.Shape) >= 2 {
			to = opt.Type
			if t.Shape[0]%uint64(to.BlockSize()) != 0 {
				to = F16
				if opt.Fallback != nil {
					opt.Fallback(t.Name, t.Shape[0], to)
				}
			}
		}
		if t.Type != to && !t.Type.Computable() {
			return nil, nil, fmt.Errorf("convert: %s: tensor %s has type %s, which tandem cannot dequantize", src.Path, t.Name, t.Type)
		}
		infos[i] = TensorInfo{Name: t.Name, Type: to, Shape: t.Shape}
	}
	return md, infos, nil
}

// Convert writes src as a GGUF v3 file to w. Tensors whose type does not
// change are copied byte for byte (so F32 -> F32 is bit-identical); the
// others are dequantized to float32 and requantized a chunk of rows at a
// time.
func Convert(src *File, w io.Writer, opt ConvertOptions) error {
	md, infos, err := ConvertPlan(src, opt)
	if err != nil {
		return err
	}
	var total, done uint64
	for _, in := range infos {
		n, _ := in.Bytes()
		total += n
	}
	g, err := NewGGUFWriter(w, md, infos)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	progress := func(n uint64) {
		done += n
		if opt.Progress != nil {
			opt.Progress(done, total)
		}
	}
	var f32 []float32
	var out []byte
	for i, t := range src.Tensors {
		to := infos[i].Type
		if t.Data == nil {
			return fmt.Errorf("convert: %s: tensor %s has no data (open the file with weights.Open)", src.Path, t.Name)
		}
		if t.Type == to {
			if _, err := g.Write(t.Data); err != nil {
				return fmt.Errorf("convert: %w", err)
			}
			progress(uint64(len(t.Data)))
			continue
		}
		rows, cols := t.Rows()
		inRow, _ := t.Type.RowBytes(uint64(cols))
		outRow, _ := to.RowBytes(uint64(cols))
		step := max(1, convertChunk/cols)
		for r := 0; r < rows; r += step {
			n := min(step, rows-r)
			f32 = grow(f32, n*cols)
			out = grow(out, n*int(outRow))
			if err := Dequantize(t.Type, t.Data[uint64(r)*inRow:uint64(r+n)*inRow], f32); err != nil {
				return fmt.Errorf("convert: %s: tensor %s rows %d..%d: %w", src.Path, t.Name, r, r+n, err)
			}
			if err := Quantize(to, f32, out); err != nil {
				return fmt.Errorf("convert: %s: tensor %s rows %d..%d to %s: %w", src.Path, t.Name, r, r+n, to, err)
			}
			if _, err := g.Write(out); err != nil {
				return fmt.Errorf("convert: %w", err)
			}
			progress(uint64(len(out)))
		}
	}
	if err := g.Close(); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	return nil
}

func canQuantize(t DType) bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0:
		return true
	}
	return false
}

// grow returns s resized to n, reusing its memory when it is big enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
