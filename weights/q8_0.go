package weights

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Q8_0 block (34 bytes, 32 weights), as ggml's block_q8_0:
//
//	bytes 0..1   d, f16 little-endian
//	bytes 2..33  q[0..31], int8
//
// Weight j is d * q[j].

// DequantizeQ8_0 decodes one Q8_0 block: y[j] = d * q[j].
func DequantizeQ8_0(b *[BlockBytesQ8_0]byte, y *[QK]float32) {
	d := F16ToF32(binary.LittleEndian.Uint16(b[0:]))
	for j := range y {
		y[j] = float32(int8(b[2+j])) * d
	}
}

// QuantizeQ8_0 encodes 32 weights as ggml's quantize_row_q8_0_ref does:
// d = max|x|/127, q = round(x/d) with halves away from zero, using the
// unrounded d for q and storing d as f16. The error per weight is at most
// d/2 + 127*|d - f16(d)| <= 0.5625*d. It fails on NaN/Inf or when d
// overflows f16 (max|x| > 65504*127).
func QuantizeQ8_0(x *[QK]float32, b *[BlockBytesQ8_0]byte) error {
	if err := checkFinite(x[:]); err != nil {
		return err
	}
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	if d > 65504 {
		return fmt.Errorf("Q8_0 scale %g: %w", d, ErrNotFinite)
	}
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	for j, v := range x {
		b[2+j] = byte(int8(math.Round(float64(v * id))))
	}
	return nil
}
