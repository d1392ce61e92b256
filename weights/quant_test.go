package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// blockTypes are the block-quantized types Quantize and Dequantize support.
var blockTypes = []DType{Q8_0, Q4_0, Q4_K, Q6_K}

func TestDequantizeQ8_0Known(t *testing.T) {
	var b [BlockBytesQ8_0]byte
	binary.LittleEndian.PutUint16(b[0:], 0x3800) // d = 0.5
	q := []int8{0, 1, -1, 127, -128, 5}
	for j, v := range q {
		b[2+j] = byte(v)
	}
	var want [QK]float32
	copy(want[:], []float32{0, 0.5, -0.5, 63.5, -64, 2.5}) // d*q; the rest are q=0
	checkDequant(t, Q8_0, b[:], want[:])
}

func TestDequantizeQ4_0Known(t *testing.T) {
	var b [BlockBytesQ4_0]byte
	binary.LittleEndian.PutUint16(b[0:], 0x4000) // d = 2
	for j := 2; j < len(b); j++ {
		b[j] = 0x88 // both nibbles 8: weight 0
	}
	b[2+0] = 0x9f  // weight 0: (15-8)*2 = 14; weight 16: (9-8)*2 = 2
	b[2+1] = 0x08  // weight 1: (8-8)*2 = 0;  weight 17: (0-8)*2 = -16
	b[2+15] = 0x37 // weight 15: (7-8)*2 = -2; weight 31: (3-8)*2 = -10
	var want [QK]float32
	want[0], want[16] = 14, 2
	want[1], want[17] = 0, -16
	want[15], want[31] = -2, -10
	checkDequant(t, Q4_0, b[:], want[:])
}

func TestScaleMinQ4_K(t *testing.T) {
	// Hand-packed: sc0=2 m0=3, sc4=21 (0b01_0101) m4=34 (0b10_0010),
	// sc7=m7=63, sub-block 1 sc=1; everything else 0.
	s := [12]byte{
		0:  2 | 1<<6, // sc0 | top bits of sc4
		1:  1,        // sc1
		3:  0 | 3<<6, // sc3=0 | top bits of sc7
		4:  3 | 2<<6, // m0 | top bits of m4
		7:  0 | 3<<6, // m3=0 | top bits of m7
		8:  5 | 2<<4, // low nibbles of sc4, m4
		11: 0xff,     // low nibbles of sc7, m7
	}
	want := [8][2]uint8{{2, 3}, {1, 0}, {0, 0}, {0, 0}, {21, 34}, {0, 0}, {0, 0}, {63, 63}}
	for j, w := range want {
		if sc, m := ScaleMinQ4_K(&s, j); sc != w[0] || m != w[1] {
			t.Errorf("sub-block %d: scale,min = %d,%d, want %d,%d", j, sc, m, w[0], w[1])
		}
	}
	// The packer is the exact inverse for random 6-bit values.
	rng := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		var sc, m [8]uint8
		for j := range 8 {
			sc[j], m[j] = uint8(rng.IntN(64)), uint8(rng.IntN(64))
		}
		var p [12]byte
		putScaleMinQ4_K(&p, &sc, &m)
		for j := range 8 {
			if gs, gm := ScaleMinQ4_K(&p, j); gs != sc[j] || gm != m[j] {
				t.Fatalf("packed %v/%v, sub-block %d reads back %d/%d", sc, m, j, gs, gm)
			}
		}
	}
}

func TestDequantizeQ4_KKnown(t *testing.T) {
	var b [BlockBytesQ4_K]byte
	binary.LittleEndian.PutUint16(b[0:], 0x3c00) // d = 1
	binary.LittleEndian.PutUint16(b[2:], 0x3800) // dmin = 0.5
	copy(b[4:16], []byte{2 | 1<<6, 1, 0, 3 << 6, 3 | 2<<6, 0, 0, 3 << 6, 5 | 2<<4, 0, 0, 0xff})
	// Sub-block scales/mins as in TestScaleMinQ4_K:
	// 0: 2,3  1: 1,0  4: 21,34  7: 63,63  others 0,0.
	qs := b[16:]
	qs[0] = 0x7a   // chunk 0: weight 0 (sub-block 0) q=10, weight 32 (sub-block 1) q=7
	qs[64] = 0x3c  // chunk 2: weight 128 (sub-block 4) q=12, weight 160 (sub-block 5) q=3
	qs[127] = 0xf0 // chunk 3: weight 223 (sub-block 6) q=0, weight 255 (sub-block 7) q=15
	var want [QKK]float32
	for l := range 32 {
		want[l] = -1.5      // sub-block 0, q=0: 1*2*0 - 0.5*3
		want[128+l] = -17   // sub-block 4, q=0: -0.5*34
		want[224+l] = -31.5 // sub-block 7, q=0: -0.5*63
	}
	want[0] = 18.5    // 1*2*10 - 0.5*3
	want[32] = 7      // 1*1*7 - 0
	want[128] = 235   // 1*21*12 - 0.5*34
	want[160] = 0     // sub-block 5 has scale 0, min 0
	want[255] = 913.5 // 1*63*15 - 0.5*63
	checkDequant(t, Q4_K, b[:], want[:])
}

func TestDequantizeQ6_KKnown(t *testing.T) {
	var b [BlockBytesQ6_K]byte
	ql, qh, sc := b[0:128], b[128:192], b[192:208]
	binary.LittleEndian.PutUint16(b[208:], 0x3400) // d = 0.25
	for i, v := range map[int]int8{0: 1, 2: -2, 4: 3, 6: 4, 9: -128, 15: 127} {
		sc[i] = byte(v)
	}
	ql[0] = 0x21   // weight 0 low bits 1, weight 64 low bits 2
	qh[0] = 0xe4   // 0b11_10_01_00: high bits 0 (w0), 1 (w32), 2 (w64), 3 (w96)
	ql[127] = 0xf0 // half 1, l=31: weight 255 low bits 15 (weight 191 low bits 0)
	qh[63] = 0xc0  // half 1, l=31: weight 255 high bits 3
	// Default level 0 is q=-32, so each sub-block i is 0.25*sc[i]*-32 = -8*sc[i].
	var want [QKK]float32
	for i, v := range map[int]float32{0: -8, 2: 16, 4: -24, 6: -32, 9: 1024, 15: -1016} {
		for k := 16 * i; k < 16*i+16; k++ {
			want[k] = v
		}
	}
	want[0] = -7.75    // 0.25*1*((1|0<<4)-32)
	want[32] = 8       // 0.25*-2*((0|1<<4)-32)
	want[64] = 1.5     // 0.25*3*((2|2<<4)-32)
	want[96] = 16      // 0.25*4*((0|3<<4)-32)
	want[255] = 984.25 // 0.25*127*((15|3<<4)-32)
	checkDequant(t, Q6_K, b[:], want[:])
}

func checkDequant(t *testing.T, typ DType, src []byte, want []float32) {
	t.Helper()
	got := make([]float32, len(want))
	if err := Dequantize(typ, src, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s weight %d = %g, want %g", typ, i, got[i], want[i])
		}
	}
}

func TestQuantizeKnown(t *testing.T) {
	// Q4_0 as ggml does it: weights -16..15, the first largest magnitude is
	// -16 so d = -16/-8 = 2 and q = trunc(x/2 + 8.5); -15 -> 1 (ties go up).
	var x [QK]float32
	for j := range x {
		x[j] = float32(j - 16)
	}
	var b4 [BlockBytesQ4_0]byte
	if err := QuantizeQ4_0(&x, &b4); err != nil {
		t.Fatal(err)
	}
	if d := binary.LittleEndian.Uint16(b4[0:]); d != 0x4000 {
		t.Errorf("Q4_0 d = %#04x, want 0x4000 (2.0)", d)
	}
	for j, v := range x {
		q := min(15, int(v/2+8.5))
		nib := b4[2+j%16] & 0xf
		if j >= 16 {
			nib = b4[2+j%16] >> 4
		}
		if int(nib) != q {
			t.Errorf("Q4_0 weight %d (%g): level %d, want %d", j, v, nib, q)
		}
	}

	// Q8_0 rounds halves away from zero like C's roundf: with max|x| = 127,
	// d = 1 and 2.5 -> 3, -2.5 -> -3, 0.5 -> 1, -126.5 -> -127.
	x = [QK]float32{127, 2.5, -2.5, 0.5, -126.5, 1.49}
	var b8 [BlockBytesQ8_0]byte
	if err := QuantizeQ8_0(&x, &b8); err != nil {
		t.Fatal(err)
	}
	for j, want := range []int8{127, 3, -3, 1, -127, 1, 0} {
		if got := int8(b8[2+j]); got != want {
			t.Errorf("Q8_0 %g: q = %d, want %d", x[j], got, want)
		}
	}

	// Q8_0: a block of all-equal values is 127 levels of d = x/127.
	for _, v := range []float32{3, -0.25, 0} {
		for j := range x {
			x[j] = v
		}
		var b8 [BlockBytesQ8_0]byte
		if err := QuantizeQ8_0(&x, &b8); err != nil {
			t.Fatal(err)
		}
		if d, want := binary.LittleEndian.Uint16(b8[0:]), F32ToF16(float32(math.Abs(float64(v)))/127); d != want {
			t.Errorf("Q8_0 all %g: d = %#04x, want %#04x", v, d, want)
		}
		wantQ := int8(0)
		if v > 0 {
			wantQ = 127
		} else if v < 0 {
			wantQ = -127
		}
		for j := range QK {
			if int8(b8[2+j]) != wantQ {
				t.Fatalf("Q8_0 all %g: q[%d] = %d, want %d", v, j, int8(b8[2+j]), wantQ)
			}
		}
	}

	// K types: an all-equal super-block decodes to one value within half
	// a step of the input.
	for _, typ := range []DType{Q4_K, Q6_K} {
		for _, v := range []float32{2, -2, 0.001, 0} {
			src := make([]float32, QKK)
			for i := range src {
				src[i] = v
			}
			got := roundTrip(t, typ, src)
			for i := range got {
				if got[i] != got[0] {
					t.Fatalf("%s all %g: weight %d = %g differs from weight 0 = %g", typ, v, i, got[i], got[0])
				}
			}
			if v == 0 && got[0] != 0 {
				t.Errorf("%s all zero decodes to %g", typ, got[0])
			}
			// One level step is at most |v|/15 (Q4_K) or |v|/31.5 (Q6_K) plus
			// scale rounding: 5% of |v| is a generous half step for both.
			if e := math.Abs(float64(got[0] - v)); e > 0.05*math.Abs(float64(v)) {
				t.Errorf("%s all %g decodes to %g", typ, v, got[0])
			}
		}
	}
}

func roundTrip(t *testing.T, typ DType, src []float32) []float32 {
	t.Helper()
	n, err := typ.RowBytes(uint64(len(src)))
	if err != nil {
		t.Fatal(err)
	}
	q := make([]byte, n)
	if err := Quantize(typ, src, q); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(src))
	if err := Dequantize(typ, q, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// testData makes n weights of one of several shapes of distribution.
func testData(rng *rand.Rand, kind string, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "normal":
			x[i] = float32(rng.NormFloat64())
		case "uniform":
			x[i] = float32(rng.Float64()*2 - 1)
		case "positive":
			x[i] = float32(rng.Float64()*3 + 0.5)
		case "negative":
			x[i] = -float32(rng.Float64() * 0.01)
		case "outliers":
			x[i] = float32(rng.NormFloat64() * 0.02)
			if rng.IntN(50) == 0 {
				x[i] *= 300
			}
		case "sparse":
			if rng.IntN(10) == 0 {
				x[i] = float32(rng.NormFloat64())
			}
		}
	}
	return x
}

// errorBound returns, for the block b of type typ that encodes src, the
// largest error each weight may have, as each quantizer documents it.
func errorBound(typ DType, src []float32, b []byte) []float64 {
	bound := make([]float64, len(src))
	const eps = 1e-6 // relative slack for f32 arithmetic
	switch typ {
	case Q8_0:
		var amax float64
		for _, v := range src {
			amax = max(amax, math.Abs(float64(v)))
		}
		d := amax / 127
		for i := range bound {
			bound[i] = d/2 + 127*f16Err(d) + eps*amax
		}
	case Q4_0:
		var amax, m float64
		for _, v := range src {
			if a := math.Abs(float64(v)); a > amax {
				amax, m = a, float64(v)
			}
		}
		d := m / -8
		for i, v := range src {
			half := 0.5
			if float64(v)/d >= 7.5 {
				half = 1 // clipped to level 7
			}
			bound[i] = half*math.Abs(d) + 8*f16Err(d) + eps*amax
		}
	case Q4_K:
		d := float64(F16ToF32(binary.LittleEndian.Uint16(b[0:])))
		for j := range 8 {
			sc, _ := ScaleMinQ4_K((*[12]byte)(b[4:16]), j)
			var amax float64
			for _, v := range src[32*j : 32*j+32] {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i := 32 * j; i < 32*j+32; i++ {
				bound[i] = d*float64(sc)/2 + eps*amax
			}
		}
	case Q6_K:
		d := float64(F16ToF32(binary.LittleEndian.Uint16(b[208:])))
		for j := range 16 {
			var amax float64
			for _, v := range src[16*j : 16*j+16] {
				amax = max(amax, math.Abs(float64(v)))
			}
			step := d * float64(int8(b[192+j]))
			for i := 16 * j; i < 16*j+16; i++ {
				bound[i] = step/2 + eps*amax
			}
		}
	}
	return bound
}

// f16Err bounds |d - f16(d)|: half an f16 ulp, relative 2^-11 in the
// normal range and absolute 2^-25 among subnormals.
func f16Err(d float64) float64 {
	return max(math.Abs(d)/2048, 1.0/(1<<25))
}

// checkStepBound checks the largest step each K quantizer documents for a sub-block.
func checkStepBound(t *testing.T, typ DType, src []float32, b []byte) {
	t.Helper()
	switch typ {
	case Q4_K:
		d := float64(F16ToF32(binary.LittleEndian.Uint16(b[0:])))
		dmin := float64(F16ToF32(binary.LittleEndian.Uint16(b[2:])))
		for j := range 8 {
			sc, _ := ScaleMinQ4_K((*[12]byte)(b[4:16]), j)
			mn, mx := 0.0, math.Inf(-1)
			for _, v := range src[32*j : 32*j+32] {
				mn, mx = min(mn, float64(v)), max(mx, float64(v))
			}
			if step, lim := d*float64(sc), (mx-mn+dmin)/15+d; step > lim*(1+1e-6) {
				t.Errorf("Q4_K sub-block %d: step %g > (max-min+dmin)/15+d = %g", j, step, lim)
			}
		}
	case Q6_K:
		d := float64(F16ToF32(binary.LittleEndian.Uint16(b[208:])))
		for j := range 16 {
			var amax float64
			for _, v := range src[16*j : 16*j+16] {
				amax = max(amax, math.Abs(float64(v)))
			}
			if step, lim := d*float64(int8(b[192+j])), amax/31.5+d; step > lim*(1+1e-6) {
				t.Errorf("Q6_K sub-block %d: step %g > max|x|/31.5+d = %g", j, step, lim)
			}
		}
	}
}

// TestQuantizeRoundTrip checks every weight of random data against the
// error bound its type documents: Q8_0 <= 0.5625*max|x|/127; Q4_0 <= |d|/2
// (|d| where clipped) plus f16 rounding, d = max|x|/8; Q4_K and Q6_K <=
// half the sub-block step stored in the block, with the step itself bounded
// by (max-min(0,min)+dmin)/15+d and max|x|/31.5+d.
func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, typ := range blockTypes {
		for _, kind := range []string{"normal", "uniform", "positive", "negative", "outliers", "sparse"} {
			for _, blocks := range []int{1, 3, 17} {
				t.Run(fmt.Sprintf("%s/%s/%d", typ, kind, blocks), func(t *testing.T) {
					src := testData(rng, kind, blocks*typ.BlockSize())
					q := make([]byte, blocks*typ.TypeSize())
					if err := Quantize(typ, src, q); err != nil {
						t.Fatal(err)
					}
					got := make([]float32, len(src))
					if err := Dequantize(typ, q, got); err != nil {
						t.Fatal(err)
					}
					var sq, se float64
					for blk := range blocks {
						bs, ts := typ.BlockSize(), typ.TypeSize()
						s, b := src[blk*bs:(blk+1)*bs], q[blk*ts:(blk+1)*ts]
						checkStepBound(t, typ, s, b)
						bound := errorBound(typ, s, b)
						for i, v := range s {
							e := math.Abs(float64(got[blk*bs+i] - v))
							if e > bound[i] {
								t.Errorf("block %d weight %d: %g decodes to %g, error %g > bound %g", blk, i, v, got[blk*bs+i], e, bound[i])
							}
							se += e * e
							sq += float64(v) * float64(v)
						}
					}
					if sq > 0 {
						t.Logf("relative RMS error %.4f", math.Sqrt(se/sq))
					}
				})
			}
		}
	}
}

// TestPlainRoundTrip: F32 is exact, and F16/BF16 decode to the nearest
// representable value (checked through the scalar converters, which
// f16_test checks exhaustively).
func TestPlainRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	src := testData(rng, "outliers", 1000)
	src = append(src, float32(math.Inf(1)), float32(math.NaN()), 1e6, -0)
	for _, typ := range []DType{F32, F16, BF16} {
		t.Run(typ.String(), func(t *testing.T) {
			got := roundTrip(t, typ, src)
			for i, v := range src {
				want := v
				switch typ {
				case F16:
					want = F16ToF32(F32ToF16(v))
				case BF16:
					want = BF16ToF32(F32ToBF16(v))
				}
				if math.Float32bits(got[i]) != math.Float32bits(want) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want))) {
					t.Errorf("weight %d: %g decodes to %g, want %g", i, v, got[i], want)
				}
			}
		})
	}
}

// TestQuantizeNotFinite: block types refuse NaN, Inf and values whose scale
// overflows f16, and say which block; plain types convert them.
func TestQuantizeNotFinite(t *testing.T) {
	bad := map[string]float32{
		"NaN":  float32(math.NaN()),
		"+Inf": float32(math.Inf(1)),
		"-Inf": float32(math.Inf(-1)),
		"huge": 1e30,
	}
	for _, typ := range blockTypes {
		for name, v := range bad {
			t.Run(typ.String()+"/"+name, func(t *testing.T) {
				src := make([]float32, 2*typ.BlockSize())
				src[typ.BlockSize()+3] = v
				dst := make([]byte, 2*typ.TypeSize())
				err := Quantize(typ, src, dst)
				if !errors.Is(err, ErrNotFinite) {
					t.Fatalf("Quantize = %v, want ErrNotFinite", err)
				}
				t.Log(err)
			})
		}
	}
}

func TestConvertErrors(t *testing.T) {
	tests := []struct {
		name   string
		typ    DType
		n      int // elements
		bytes  int
		quant  bool
		unsupp bool
	}{
		{"unsupported Q5_K", Q5_K, 256, 176, false, true},
		{"unsupported I32", I32, 4, 16, true, true},
		{"unknown type", DType(99), 1, 4, false, true},
		{"Q8_0 partial block", Q8_0, 31, 34, false, false},
		{"Q4_K partial block", Q4_K, 255, 144, true, false},
		{"Q4_0 short source", Q4_0, 64, 35, false, false},
		{"Q6_K short destination", Q6_K, 256, 209, true, false},
		{"F16 short source", F16, 3, 5, false, false},
		{"F32 short destination", F32, 2, 7, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.quant {
				err = Quantize(tc.typ, make([]float32, tc.n), make([]byte, tc.bytes))
			} else {
				err = Dequantize(tc.typ, make([]byte, tc.bytes), make([]float32, tc.n))
			}
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, ErrUnsupported) != tc.unsupp {
				t.Errorf("errors.Is(%v, ErrUnsupported) = %v, want %v", err, !tc.unsupp, tc.unsupp)
			}
		})
	}
	// Longer buffers than needed are fine and the excess is untouched.
	dst := make([]byte, 40)
	for i := range dst {
		dst[i] = 0xee
	}
	if err := Quantize(Q8_0, make([]float32, 32), dst); err != nil {
		t.Fatal(err)
	}
	if dst[34] != 0xee || dst[39] != 0xee {
		t.Error("Quantize wrote past the encoded block")
	}
}

// FuzzQuantize encodes arbitrary floats (scaled by 2^shift to reach tiny
// and huge magnitudes) with every block type: it must either refuse them
// with ErrNotFinite or decode every weight within the documented bound.
func FuzzQuantize(f *testing.F) {
	f.Add(uint8(0), int8(0), []byte{0, 0, 0x80, 0x3f, 0, 0, 0x80, 0xbf})
	f.Add(uint8(2), int8(-100), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, sel uint8, shift int8, raw []byte) {
		typ := blockTypes[int(sel)%len(blockTypes)]
		bs := typ.BlockSize()
		n := (len(raw)/4 + bs - 1) / bs * bs
		if n == 0 {
			n = bs
		}
		src := make([]float32, n)
		for i := 0; i+4 <= len(raw); i += 4 {
			v := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
			src[i/4] = float32(math.Ldexp(float64(v), int(shift)%64))
		}
		q := make([]byte, n/bs*typ.TypeSize())
		if err := Quantize(typ, src, q); err != nil {
			if !errors.Is(err, ErrNotFinite) {
				t.Fatal(err)
			}
			return
		}
		got := make([]float32, n)
		if err := Dequantize(typ, q, got); err != nil {
			t.Fatal(err)
		}
		ts := typ.TypeSize()
		for blk := range n / bs {
			bound := errorBound(typ, src[blk*bs:(blk+1)*bs], q[blk*ts:(blk+1)*ts])
			for i, b := range bound {
				k := blk*bs + i
				if e := math.Abs(float64(got[k] - src[k])); !(e <= b) {
					t.Fatalf("%s weight %d: %g decodes to %g, error %g > bound %g", typ, k, src[k], got[k], e, b)
				}
			}
		}
	})
}

// FuzzDequantize feeds arbitrary bytes to every supported type: decoding
// must never panic, and re-encoding the block types must succeed whenever
// the decoded weights are finite and small enough for an f16 scale.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(0), []byte{0, 0, 0x80, 0x3f})
	f.Add(uint8(4), make([]byte, 300))
	f.Fuzz(func(t *testing.T, sel uint8, src []byte) {
		types := []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K}
		typ := types[int(sel)%len(types)]
		n := len(src) / typ.TypeSize() * typ.BlockSize()
		dst := make([]float32, n)
		if err := Dequantize(typ, src, dst); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(typ, src, make([]float32, n+typ.BlockSize())); err == nil {
			t.Fatal("Dequantize accepted a source one block short")
		}
		re := make([]byte, len(src))
		err := Quantize(typ, dst, re)
		if err != nil && !errors.Is(err, ErrNotFinite) {
			t.Fatal(err)
		}
	})
}

func BenchmarkDequantize(b *testing.B) {
	const n = 1 << 16
	rng := rand.New(rand.NewPCG(11, 12))
	src := testData(rng, "normal", n)
	for _, typ := range []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K} {
		b.Run(typ.String(), func(b *testing.B) {
			q := make([]byte, n/typ.BlockSize()*typ.TypeSize())
			if err := Quantize(typ, src, q); err != nil {
				b.Fatal(err)
			}
			dst := make([]float32, n)
			b.SetBytes(int64(len(q)))
			for b.Loop() {
				if err := Dequantize(typ, q, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkQuantize(b *testing.B) {
	const n = 1 << 16
	rng := rand.New(rand.NewPCG(13, 14))
	src := testData(rng, "normal", n)
	for _, typ := range []DType{F16, Q8_0, Q4_0, Q4_K, Q6_K} {
		b.Run(typ.String(), func(b *testing.B) {
			q := make([]byte, n/typ.BlockSize()*typ.TypeSize())
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := Quantize(typ, src, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
