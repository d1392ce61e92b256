package weights

import (
	"encoding/binary"
	"math"
)

// Q4_K super-block (144 bytes, 256 weights), as ggml's block_q4_K:
//
//	bytes 0..1     d, f16: scale of the sub-block scales
//	bytes 2..3     dmin, f16: scale of the sub-block mins
//	bytes 4..15    scales: eight 6-bit scales and eight 6-bit mins (ScaleMinQ4_K)
//	bytes 16..143  qs: 4-bit levels
//
// The 256 weights are 8 sub-blocks of 32. They are stored in 4 chunks of
// 64: chunk c uses qs[32c:32c+32]; sub-block 2c is the low nibbles and
// sub-block 2c+1 the high nibbles of those bytes. Weight l of sub-block j
// is d*sc[j]*q - dmin*m[j].

// ScaleMinQ4_K unpacks the 6-bit scale and min of sub-block j (0..7) from
// the 12 scale bytes, as ggml's get_scale_min_k4: sub-blocks 0..3 keep them
// in the low 6 bits of s[j] and s[j+4]; sub-blocks 4..7 keep their low 4
// bits in the nibbles of s[j+4] and their top 2 bits in the top 2 bits of
// s[j-4] (scale) and s[j] (min).
func ScaleMinQ4_K(s *[12]byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// putScaleMinQ4_K is the inverse of ScaleMinQ4_K for all 8 sub-blocks.
func putScaleMinQ4_K(s *[12]byte, sc, m *[8]uint8) {
	for j := 0; j < 4; j++ {
		s[j] = sc[j]&63 | (sc[j+4]>>4)<<6
		s[j+4] = m[j]&63 | (m[j+4]>>4)<<6
		s[j+8] = sc[j+4]&0xf | (m[j+4]&0xf)<<4
	}
}

// DequantizeQ4_K decodes one Q4_K super-block, bit-exact with ggml's
// dequantize_row_q4_K (d*sc and dmin*m are rounded to f32 first).
func DequantizeQ4_K(b *[BlockBytesQ4_K]byte, y *[QKK]float32) {
	d := F16ToF32(binary.LittleEndian.Uint16(b[0:]))
	dmin := F16ToF32(binary.LittleEndian.Uint16(b[2:]))
	s := (*[12]byte)(b[4:16])
	for c := 0; c < 4; c++ {
		sc, m := ScaleMinQ4_K(s, 2*c)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = ScaleMinQ4_K(s, 2*c+1)
		d2, m2 := d*float32(sc), dmin*float32(m)
		q := (*[32]byte)(b[16+32*c:])
		out := (*[64]float32)(y[64*c:])
		for l, v := range q {
			// float32(...) forbids FMA fusion so results match ggml's.
			out[l] = float32(d1*float32(v&0xf)) - m1
			out[32+l] = float32(d2*float32(v>>4)) - m2
		}
	}
}

// QuantizeQ4_K encodes 256 weights in one pass (no search, unlike ggml's
// make_qkx2_quants). Per sub-block j, the offset dmin*m[j] is chosen as
// the smallest multiple of dmin covering -min(0, min x) and the step
// d*sc[j] as the smallest multiple of d covering (max x + offset)/15, with
// d and dmin rounded up when stored as f16 so nothing clips. Each weight
// then gets the nearest level, so its error is at most d*sc[j]/2 (up to
// f32 rounding), and d*sc[j] <= (max x - min(0, min x) + dmin)/15 + d.
// It fails on NaN/Inf or when a scale overflows f16.
func QuantizeQ4_K(x *[QKK]float32, b *[BlockBytesQ4_K]byte) error {
	if err := checkFinite(x[:]); err != nil {
		return err
	}
	// Scale choices run in float64 so tiny weights cannot underflow them.
	var lo, hi [8]float64 // lo: offset needed (>= 0); hi: sub-block maximum
	var maxLo float64
	for j := range 8 {
		sub := x[32*j : 32*j+32]
		mn, mx := float32(0), sub[0]
		for _, v := range sub {
			mn, mx = min(mn, v), max(mx, v)
		}
		lo[j], hi[j] = -float64(mn), float64(mx)
		maxLo = max(maxLo, lo[j])
	}
	dminH, err := f16Scale(maxLo / 63)
	if err != nil {
		return err
	}
	dmin := F16ToF32(dminH)
	var ms, scs [8]uint8
	var offs [8]float32
	var steps [8]float64
	var maxStep float64
	for j := range 8 {
		if dmin > 0 {
			ms[j] = uint8(min(63, math.Ceil(lo[j]/float64(dmin))))
		}
		offs[j] = dmin * float32(ms[j]) // exactly the dequantizer's dmin*m
		steps[j] = max(0, (hi[j]+float64(offs[j]))/15)
		maxStep = max(maxStep, steps[j])
	}
	dH, err := f16Scale(maxStep / 63)
	if err != nil {
		return err
	}
	d := F16ToF32(dH)
	for j := range 8 {
		if d > 0 {
			scs[j] = uint8(min(63, math.Ceil(steps[j]/float64(d))))
		}
	}
	binary.LittleEndian.PutUint16(b[0:], dH)
	binary.LittleEndian.PutUint16(b[2:], dminH)
	putScaleMinQ4_K((*[12]byte)(b[4:16]), &scs, &ms)
	for c := 0; c < 4; c++ {
		for half := 0; half < 2; half++ {
			j := 2*c + half
			ds, dm := float64(d*float32(scs[j])), float64(offs[j]) // the dequantizer's d1, m1
			for l := 0; l < 32; l++ {
				var q uint8
				if ds > 0 {
					q = uint8(min(15, max(0, math.Round((float64(x[32*j+l])+dm)/ds))))
				}
				if half == 0 {
					b[16+32*c+l] = q
				} else {
					b[16+32*c+l] |= q << 4
				}
			}
		}
	}
	return nil
}
