package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Block byte sizes of the computable types, so kernels can slice rows into
// fixed-size arrays (e.g. (*[BlockBytesQ4_0]byte)(row[i*BlockBytesQ4_0:])).
const (
	BlockBytesQ8_0 = 2 + QK       // f16 d, 32 x int8
	BlockBytesQ4_0 = 2 + QK/2     // f16 d, 16 bytes of nibble pairs
	BlockBytesQ4_K = 4 + 12 + 128 // f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes
	BlockBytesQ6_K = 128 + 64 + 16 + 2
)

// ErrUnsupported is returned (wrapped) for a type Dequantize or Quantize has
// no code for; callers test it with errors.Is.
var ErrUnsupported = errors.New("tensor type not supported for conversion")

// ErrNotFinite is returned (wrapped) when Quantize is asked to put NaN or
// ±Inf, or a value whose block scale overflows f16, into a block type: the
// scale would become NaN/Inf and poison the whole block silently.
var ErrNotFinite = errors.New("value cannot be quantized (NaN, Inf or beyond the f16 scale range)")

// Dequantize decodes len(dst) elements of type t from src into dst.
// len(dst) must be a multiple of t.BlockSize() and src must hold at least
// t.RowBytes(len(dst)) bytes (more is ignored). Supported types: F32 F16
// BF16 Q8_0 Q4_0 Q4_K Q6_K. The results are bit-exact with ggml's
// dequantize_row_* reference code. Any bytes decode without error: an f16
// scale that is NaN or Inf simply yields NaN/Inf weights, as in ggml.
func Dequantize(t DType, src []byte, dst []float32) error {
	need, err := convSize(t, len(dst), "Dequantize")
	if err != nil {
		return err
	}
	if uint64(len(src)) < need {
		return fmt.Errorf("Dequantize %s: %d elements need %d source bytes, got %d", t, len(dst), need, len(src))
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q8_0:
		for i := 0; i < len(dst)/QK; i++ {
			DequantizeQ8_0((*[BlockBytesQ8_0]byte)(src[i*BlockBytesQ8_0:]), (*[QK]float32)(dst[i*QK:]))
		}
	case Q4_0:
		for i := 0; i < len(dst)/QK; i++ {
			DequantizeQ4_0((*[BlockBytesQ4_0]byte)(src[i*BlockBytesQ4_0:]), (*[QK]float32)(dst[i*QK:]))
		}
	case Q4_K:
		for i := 0; i < len(dst)/QKK; i++ {
			DequantizeQ4_K((*[BlockBytesQ4_K]byte)(src[i*BlockBytesQ4_K:]), (*[QKK]float32)(dst[i*QKK:]))
		}
	case Q6_K:
		for i := 0; i < len(dst)/QKK; i++ {
			DequantizeQ6_K((*[BlockBytesQ6_K]byte)(src[i*BlockBytesQ6_K:]), (*[QKK]float32)(dst[i*QKK:]))
		}
	}
	return nil
}

// Quantize encodes src as type t into dst. len(src) must be a multiple of
// t.BlockSize() and dst must hold at least t.RowBytes(len(src)) bytes (the
// rest is left untouched). F32, F16 and BF16 convert every value, NaN and
// Inf included. The block types reject NaN, ±Inf and magnitudes whose
// scale overflows f16 with ErrNotFinite, leaving dst partly written. Q8_0
// and Q4_0 produce the same bytes as ggml's quantize_row_*_ref; Q4_K and
// Q6_K use a simpler one-pass scale choice (see QuantizeQ4_K, QuantizeQ6_K).
func Quantize(t DType, src []float32, dst []byte) error {
	need, err := convSize(t, len(src), "Quantize")
	if err != nil {
		return err
	}
	if uint64(len(dst)) < need {
		return fmt.Errorf("Quantize %s: %d elements need %d destination bytes, got %d", t, len(src), need, len(dst))
	}
	block := func(i int, err error) error {
		if err != nil {
			return fmt.Errorf("Quantize %s: block %d (elements %d..%d): %w", t, i, i*t.BlockSize(), (i+1)*t.BlockSize()-1, err)
		}
		return nil
	}
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	case Q8_0:
		for i := 0; i < len(src)/QK; i++ {
			if err := QuantizeQ8_0((*[QK]float32)(src[i*QK:]), (*[BlockBytesQ8_0]byte)(dst[i*BlockBytesQ8_0:])); err != nil {
				return block(i, err)
			}
		}
	case Q4_0:
		for i := 0; i < len(src)/QK; i++ {
			if err := QuantizeQ4_0((*[QK]float32)(src[i*QK:]), (*[BlockBytesQ4_0]byte)(dst[i*BlockBytesQ4_0:])); err != nil {
				return block(i, err)
			}
		}
	case Q4_K:
		for i := 0; i < len(src)/QKK; i++ {
			if err := QuantizeQ4_K((*[QKK]float32)(src[i*QKK:]), (*[BlockBytesQ4_K]byte)(dst[i*BlockBytesQ4_K:])); err != nil {
				return block(i, err)
			}
		}
	case Q6_K:
		for i := 0; i < len(src)/QKK; i++ {
			if err := QuantizeQ6_K((*[QKK]float32)(src[i*QKK:]), (*[BlockBytesQ6_K]byte)(dst[i*BlockBytesQ6_K:])); err != nil {
				return block(i, err)
			}
		}
	}
	return nil
}

// convSize checks that t is convertible and n a whole number of blocks,
// and returns the bytes n elements take.
func convSize(t DType, n int, op string) (uint64, error) {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K:
	default:
		return 0, fmt.Errorf("%s %s: %w (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K)", op, t, ErrUnsupported)
	}
	if n < 0 || n%t.BlockSize() != 0 {
		return 0, fmt.Errorf("%s %s: %d elements is not a multiple of the block size %d", op, t, n, t.BlockSize())
	}
	return t.RowBytes(uint64(n))
}

// f16Scale stores a non-negative block scale as f16, rounding up so that
// the stored scale times the largest quantized level still covers x (the
// K quantizers rely on this to never clip). It fails when x is beyond f16.
// x is float64 so that scales of f32-subnormal weights do not underflow.
func f16Scale(x float64) (uint16, error) {
	if !(x >= 0 && x <= 65504) { // also catches NaN
		return 0, fmt.Errorf("block scale %g: %w", x, ErrNotFinite)
	}
	h := F32ToF16(float32(x))
	if float64(F16ToF32(h)) < x {
		h++
		if h >= 0x7c00 {
			return 0, fmt.Errorf("block scale %g: %w", x, ErrNotFinite)
		}
	}
	return h, nil
}

// checkFinite reports the first NaN or Inf in x.
func checkFinite(x []float32) error {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("element %d is %g: %w", i, v, ErrNotFinite)
		}
	}
	return nil
}
