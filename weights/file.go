package weights

import (
	"fmt"
	"io"
)

// Format names the container a model file came in.
type Format string

const (
	FormatGGUF    Format = "gguf"
	FormatLlama2C Format = "llama2c"
)

// Tensor describes one tensor of a model file and views its bytes.
type Tensor struct {
	Name  string
	Type  DType
	Shape []uint64 // GGML order: Shape[0] is the contiguous row length
	// Offset is the absolute byte offset of the data in the file, so the
	// Streamer can read it with pread without the mapping.
	Offset uint64
	Size   uint64 // bytes of data
	Data   []byte // zero-copy view into the mapped file (nil when not mapped)
}

// Elements is the product of the shape.
func (t *Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Rows returns a 2-D view of the tensor: cols = Shape[0], rows = the rest.
func (t *Tensor) Rows() (rows, cols int) {
	if len(t.Shape) == 0 {
		return 1, 1
	}
	return int(t.Elements() / t.Shape[0]), int(t.Shape[0])
}

// File is an opened model file. GGUF files expose their metadata as
// stored; llama2.c files expose the equivalent llama-architecture GGUF
// keys and tensor names, so everything above this package reads one shape.
type File struct {
	Path       string
	Format     Format
	Version    uint32 // GGUF version (0 for llama2.c)
	Alignment  uint64 // data alignment (GGUF general.alignment, default 32)
	DataOffset uint64 // absolute offset of the tensor data section
	Size       int64  // file size in bytes
	Metadata   Metadata
	Tensors    []Tensor

	byName map[string]int
	closer io.Closer
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	i, ok := f.byName[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorShaped returns the named tensor after checking its shape
// (GGML order). The error names the file, tensor and both shapes.
func (f *File) TensorShaped(name string, shape ...uint64) (*Tensor, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q is missing", f.Path, name)
	}
	if len(t.Shape) != len(shape) {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v", f.Path, name, t.Shape, shape)
	}
	for i := range shape {
		if t.Shape[i] != shape[i] {
			return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v", f.Path, name, t.Shape, shape)
		}
	}
	return t, nil
}

// Architecture is general.architecture ("" when absent).
func (f *File) Architecture() string {
	s, _ := f.Metadata.String("general.architecture")
	return s
}

// Close releases the mapping. Tensor data views are invalid afterwards.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	err := f.closer.Close()
	f.closer = nil
	return err
}

// index builds the name index and rejects duplicate names.
func (f *File) index() error {
	f.byName = make(map[string]int, len(f.Tensors))
	for i := range f.Tensors {
		name := f.Tensors[i].Name
		if _, dup := f.byName[name]; dup {
			return fmt.Errorf("%s: duplicate tensor name %q (tensor %d)", f.Path, name, i)
		}
		f.byName[name] = i
	}
	return nil
}
