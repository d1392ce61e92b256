package weights

import (
	"encoding/binary"
	"math"
)

// Q6_K super-block (210 bytes, 256 weights), as ggml's block_q6_K:
//
//	bytes 0..127    ql: low 4 bits of the levels
//	bytes 128..191  qh: high 2 bits of the levels
//	bytes 192..207  scales: 16 int8 sub-block scales (sub-block i = weights 16i..16i+15)
//	bytes 208..209  d, f16
//
// The weights are two halves of 128. In half h (ql from 64h, qh from 32h,
// scales from 8h) and for l in 0..31, with is = l/16:
//
//	weight l    = d*sc[is+0]*((ql[l]&0xF    | (qh[l]>>0&3)<<4) - 32)
//	weight l+32 = d*sc[is+2]*((ql[l+32]&0xF | (qh[l]>>2&3)<<4) - 32)
//	weight l+64 = d*sc[is+4]*((ql[l]>>4     | (qh[l]>>4&3)<<4) - 32)
//	weight l+96 = d*sc[is+6]*((ql[l+32]>>4  | (qh[l]>>6&3)<<4) - 32)

// DequantizeQ6_K decodes one Q6_K super-block, bit-exact with ggml's
// dequantize_row_q6_K ((d*sc) is rounded to f32 before the level).
func DequantizeQ6_K(b *[BlockBytesQ6_K]byte, y *[QKK]float32) {
	d := F16ToF32(binary.LittleEndian.Uint16(b[208:]))
	for h := 0; h < 2; h++ {
		ql := (*[64]byte)(b[64*h:])
		qh := (*[32]byte)(b[128+32*h:])
		sc := (*[8]byte)(b[192+8*h:])
		out := (*[128]float32)(y[128*h:])
		for l := 0; l < 32; l++ {
			is := l / 16
			q1 := int32(ql[l]&0xf|(qh[l]>>0&3)<<4) - 32
			q2 := int32(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
			q3 := int32(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int32(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			out[l] = d * float32(int8(sc[is])) * float32(q1)
			out[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			out[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			out[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
	}
}

// QuantizeQ6_K encodes 256 weights in one pass (no search, unlike ggml's
// make_qx_quants). Sub-block i's step d*sc[i] is the smallest multiple of
// d covering max|x|/31.5, with d rounded up when stored as f16, so every
// x/step lies in [-31.5, 31.5] and rounds to a level in [-32, 31] with
// error at most step/2 (up to f32 rounding); step <= max|x|/31.5 + d.
// The scales it writes are never negative. It fails on NaN/Inf or when d
// overflows f16.
func QuantizeQ6_K(x *[QKK]float32, b *[BlockBytesQ6_K]byte) error {
	if err := checkFinite(x[:]); err != nil {
		return err
	}
	// Scale choices run in float64 so tiny weights cannot underflow them.
	var need [16]float64
	var maxNeed float64
	for i := range 16 {
		var amax float64
		for _, v := range x[16*i : 16*i+16] {
			amax = max(amax, math.Abs(float64(v)))
		}
		need[i] = amax / 31.5
		maxNeed = max(maxNeed, need[i])
	}
	dH, err := f16Scale(maxNeed / 127)
	if err != nil {
		return err
	}
	d := F16ToF32(dH)
	var levels [QKK]uint8 // level + 32, 0..63
	for i := range 16 {
		var sc int8
		if d > 0 {
			sc = int8(min(127, math.Ceil(need[i]/float64(d))))
		}
		b[192+i] = byte(sc)
		step := float64(d * float32(sc)) // the dequantizer's d*sc
		for k := 16 * i; k < 16*i+16; k++ {
			q := 32.0
			if step > 0 {
				q = min(31, max(-32, math.Round(float64(x[k])/step))) + 32
			}
			levels[k] = uint8(q)
		}
	}
	binary.LittleEndian.PutUint16(b[208:], dH)
	for h := 0; h < 2; h++ {
		L := levels[128*h:]
		for l := 0; l < 32; l++ {
			b[64*h+l] = L[l]&0xf | (L[l+64]&0xf)<<4
			b[64*h+l+32] = L[l+32]&0xf | (L[l+96]&0xf)<<4
			b[128+32*h+l] = L[l]>>4 | (L[l+32]>>4)<<2 | (L[l+64]>>4)<<4 | (L[l+96]>>4)<<6
		}
	}
	return nil
}
