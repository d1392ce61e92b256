package weights

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Q4_0 block (18 bytes, 32 weights), as ggml's block_q4_0:
//
//	bytes 0..1   d, f16 little-endian
//	bytes 2..17  qs[0..15]: qs[j] low nibble is weight j, high nibble weight j+16
//
// Weight j is d * (nibble - 8), so nibbles 0..15 stand for -8..7.

// DequantizeQ4_0 decodes one Q4_0 block.
func DequantizeQ4_0(b *[BlockBytesQ4_0]byte, y *[QK]float32) {
	d := F16ToF32(binary.LittleEndian.Uint16(b[0:]))
	for j := 0; j < QK/2; j++ {
		q := b[2+j]
		y[j] = float32(int32(q&0xf)-8) * d
		y[j+QK/2] = float32(int32(q>>4)-8) * d
	}
}

// QuantizeQ4_0 encodes 32 weights as ggml's quantize_row_q4_0_ref does:
// the weight of largest magnitude m (first one on ties, sign kept) gives
// d = m / -8, so m itself maps to level -8 exactly, and every weight gets
// q = min(15, trunc(x/d + 8.5)). Weights of the other sign than m may
// reach x/d = +8, which is clipped to level 7: the error is at most |d|/2
// (plus f16 rounding of d, at most 8*|d|*2^-11) for x/d < 7.5 and at most
// |d| (same addend) in the clipped range. It fails on NaN/Inf or when d
// overflows f16 (max|x| > 65504*8).
func QuantizeQ4_0(x *[QK]float32, b *[BlockBytesQ4_0]byte) error {
	if err := checkFinite(x[:]); err != nil {
		return err
	}
	var amax, m float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, m = a, v
		}
	}
	d := m / -8
	if math.Abs(float64(d)) > 65504 {
		return fmt.Errorf("Q4_0 scale %g: %w", d, ErrNotFinite)
	}
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	for j := 0; j < QK/2; j++ {
		// float32(...) forbids fusing into an FMA, which would change
		// which side of a .5 boundary some weights land on.
		lo := min(15, int8(float32(x[j]*id)+8.5))
		hi := min(15, int8(float32(x[j+QK/2]*id)+8.5))
		b[2+j] = byte(lo) | byte(hi)<<4
	}
	return nil
}
