package weights

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// DType is a tensor element type, numbered as GGUF numbers them (ggml_type),
// so the value read from a file is the DType itself.
type DType uint32

// The GGUF type ids. Only the ones tandem computes with have kernels
// (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K); the others are known so that files
// holding them can be inspected and sized.
const (
	F32  DType = 0
	F16  DType = 1
	Q4_0 DType = 2
	Q4_1 DType = 3
	Q5_0 DType = 6
	Q5_1 DType = 7
	Q8_0 DType = 8
	Q8_1 DType = 9
	Q2_K DType = 10
	Q3_K DType = 11
	Q4_K DType = 12
	Q5_K DType = 13
	Q6_K DType = 14
	Q8_K DType = 15
	I8   DType = 24
	I16  DType = 25
	I32  DType = 26
	I64  DType = 27
	F64  DType = 28
	BF16 DType = 30
)

// QK is the number of weights in a block of the 32-wide block types
// (Q4_0, Q8_0, ...); QKK is the super-block size of the K types.
const (
	QK  = 32
	QKK = 256
)

type dtypeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
	compute   bool
}

var dtypes = map[DType]dtypeInfo{
	F32:  {"F32", 1, 4, true},
	F16:  {"F16", 1, 2, true},
	BF16: {"BF16", 1, 2, true},
	Q4_0: {"Q4_0", QK, 2 + QK/2, true},
	Q4_1: {"Q4_1", QK, 4 + QK/2, false},
	Q5_0: {"Q5_0", QK, 2 + 4 + QK/2, false},
	Q5_1: {"Q5_1", QK, 4 + 4 + QK/2, false},
	Q8_0: {"Q8_0", QK, 2 + QK, true},
	Q8_1: {"Q8_1", QK, 4 + QK, false},
	Q2_K: {"Q2_K", QKK, QKK/16 + QKK/4 + 4, false},
	Q3_K: {"Q3_K", QKK, QKK/8 + QKK/4 + 12 + 2, false},
	Q4_K: {"Q4_K", QKK, 4 + 12 + QKK/2, true},
	Q5_K: {"Q5_K", QKK, 4 + 12 + QKK/8 + QKK/2, false},
	Q6_K: {"Q6_K", QKK, QKK/2 + QKK/4 + QKK/16 + 2, true},
	Q8_K: {"Q8_K", QKK, 4 + QKK + QKK/16*2, false},
	I8:   {"I8", 1, 1, false},
	I16:  {"I16", 1, 2, false},
	I32:  {"I32", 1, 4, false},
	I64:  {"I64", 1, 8, false},
	F64:  {"F64", 1, 8, false},
}

// ComputableTypes names the types Computable accepts, in a fixed order,
// for messages about those it does not.
func ComputableTypes() []string {
	var names []string
	for t, info := range dtypes {
		if t.Computable() {
			names = append(names, info.name)
		}
	}
	slices.Sort(names)
	return names
}

// Known reports whether t is a type tandem can size (and so read from a file).
func (t DType) Known() bool { _, ok := dtypes[t]; return ok }

// Computable reports whether tandem has kernels for t.
func (t DType) Computable() bool { return dtypes[t].compute }

func (t DType) String() string {
	if info, ok := dtypes[t]; ok {
		return info.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements one block holds (1 for plain types).
func (t DType) BlockSize() int { return dtypes[t].blockSize }

// TypeSize is the number of bytes one block takes.
func (t DType) TypeSize() int { return dtypes[t].typeSize }

// RowBytes returns the bytes n elements of type t take. n must be a
// multiple of the block size; the error says so otherwise.
func (t DType) RowBytes(n uint64) (uint64, error) {
	info, ok := dtypes[t]
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if n%uint64(info.blockSize) != 0 {
		return 0, fmt.Errorf("%s needs a multiple of %d elements per row, got %d", info.name, info.blockSize, n)
	}
	hi, lo := bits.Mul64(n/uint64(info.blockSize), uint64(info.typeSize))
	if hi != 0 {
		return 0, fmt.Errorf("%d elements of %s overflow 64 bits", n, info.name)
	}
	return lo, nil
}

// ParseDType reads a type name such as "q4_0" or "F16" (case-insensitive).
func ParseDType(s string) (DType, error) {
	for t, info := range dtypes {
		if strings.EqualFold(info.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown tensor type %q (want one of f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)", s)
}

// ParseWriteType reads a type that convert, synth and inflate can write:
// f32, f16, bf16, q8_0 or q4_0 (the K types are read, not quantized).
func ParseWriteType(s string) (DType, error) {
	t, err := ParseDType(s)
	if _, ok := FileTypeFor(t); err != nil || !ok || !canQuantize(t) {
		return 0, fmt.Errorf("cannot write %q tensors (want f32, f16, bf16, q8_0 or q4_0)", s)
	}
	return t, nil
}
