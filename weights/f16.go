package weights

import "math"

// IEEE 754 binary16 ("half", GGUF F16) and bfloat16 (GGUF BF16) conversions.
// Both directions are exact where the value is representable and round to
// nearest, ties to even, otherwise: these are the reference the kernels
// are checked against, so they do bit work rather than trust the hardware.

// F16ToF32 widens a half-precision value. Every half value, subnormals,
// infinities and NaN payloads included, is exactly representable in f32.
//
// The magnitude bits shifted into f32 position read as the value times
// 2^-112 (the exponent bias difference), also for half subnormals, which
// land on f32 subnormals; one exact multiply by 2^112 fixes the scale.
// Only Inf/NaN, whose exponent must become all ones, take a branch.
func F16ToF32(h uint16) float32 {
	b := uint32(h&0x7fff) << 13
	if h&0x7c00 == 0x7c00 {
		b |= 0x7f800000 // keeps the NaN payload in the top mantissa bits
	} else {
		b = math.Float32bits(math.Float32frombits(b) * 0x1p112)
	}
	return math.Float32frombits(b | uint32(h&0x8000)<<16)
}

// F32ToF16 narrows f to half precision, rounding to nearest even.
// Values beyond the half range (|f| >= 65520) become ±Inf, values below
// half the smallest subnormal (2^-25) become ±0, and NaN stays NaN (quiet,
// sign and top payload bits kept).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant == 0 {
			return sign | 0x7c00
		}
		// Set the quiet bit so a payload that lives only in the dropped
		// low bits cannot turn the NaN into an infinity.
		return sign | 0x7c00 | 0x200 | uint16(mant>>13)
	}
	e := exp - 127 + 15 // half biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Half subnormal (or underflow to zero). In units of the smallest
		// subnormal 2^-24 the value is m * 2^(e-14) with the implicit bit set.
		if e < -10 {
			return sign // below 2^-25: rounds to zero
		}
		m := mant | 0x800000
		shift := uint32(14 - e) // 14..24
		q := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && q&1 == 1) {
			q++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(q)
	}
	q := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && q&1 == 1) {
		q++ // a carry out of the mantissa bumps the exponent, up to Inf
	}
	return sign | uint16(q)
}

// BF16ToF32 widens a bfloat16 value: it is the top half of an f32.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 narrows f to bfloat16, rounding to nearest even; values that
// round past the largest finite bf16 become ±Inf and NaN stays NaN (quiet).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
