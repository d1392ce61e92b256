package weights

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestF16ToF32Known(t *testing.T) {
	tests := []struct {
		name string
		h    uint16
		want float32
	}{
		{"zero", 0x0000, 0},
		{"one", 0x3c00, 1},
		{"minus two", 0xc000, -2},
		{"third", 0x3555, 0.333251953125}, // 1.0101010101b * 2^-2
		{"max", 0x7bff, 65504},
		{"min normal", 0x0400, 1.0 / (1 << 14)},
		{"min subnormal", 0x0001, 1.0 / (1 << 24)},
		{"max subnormal", 0x03ff, 1023.0 / (1 << 24)},
		{"negative subnormal", 0x8003, -3.0 / (1 << 24)},
		{"inf", 0x7c00, float32(math.Inf(1))},
		{"minus inf", 0xfc00, float32(math.Inf(-1))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := F16ToF32(tc.h); got != tc.want {
				t.Errorf("F16ToF32(%#04x) = %g, want %g", tc.h, got, tc.want)
			}
		})
	}
	if got := F16ToF32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("F16ToF32(0x8000) = %g, want -0", got)
	}
	for _, h := range []uint16{0x7c01, 0x7e00, 0xffff, 0x7dff} {
		if got := F16ToF32(h); !math.IsNaN(float64(got)) {
			t.Errorf("F16ToF32(%#04x) = %g, want NaN", h, got)
		}
	}
}

func TestF32ToF16Known(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"max", 65504, 0x7bff},
		{"below overflow tie", 65519.99, 0x7bff},
		{"overflow tie to even is inf", 65520, 0x7c00},
		{"huge", 1e10, 0x7c00},
		{"minus huge", -1e10, 0xfc00},
		{"tie to even down", 1 + 1.0/2048, 0x3c00}, // halfway between 0x3c00 and 0x3c01
		{"tie to even up", 1 + 3.0/2048, 0x3c02},   // halfway between 0x3c01 and 0x3c02
		{"above tie", 1 + 1.0/2048 + 1.0/(1<<20), 0x3c01},
		{"min subnormal", 1.0 / (1 << 24), 0x0001},
		{"half min subnormal ties to zero", 1.0 / (1 << 25), 0x0000},
		{"just above half min subnormal", 1.0/(1<<25) + 1.0/(1<<40), 0x0001},
		{"1.5 min subnormal ties to 2", 1.5 / (1 << 24), 0x0002},
		{"subnormal rounds to min normal", 1023.5 / (1 << 24), 0x0400},
		{"tiny", 1e-10, 0x0000},
		{"minus tiny", -1e-10, 0x8000},
		{"f32 subnormal", math.Float32frombits(1), 0x0000},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"minus inf", float32(math.Inf(-1)), 0xfc00},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := F32ToF16(tc.f); got != tc.want {
				t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
			}
		})
	}
	// NaN must stay NaN even when its payload lives only in low f32 bits.
	for _, b := range []uint32{0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff} {
		h := F32ToF16(math.Float32frombits(b))
		if h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
			t.Errorf("F32ToF16(NaN %#08x) = %#04x, not a NaN", b, h)
		}
		if (h&0x8000 != 0) != (b&0x80000000 != 0) {
			t.Errorf("F32ToF16(NaN %#08x) = %#04x lost the sign", b, h)
		}
	}
}

// TestF16RoundTripExhaustive widens and narrows every one of the 65536
// half values: non-NaN values must come back bit-identical.
func TestF16RoundTripExhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F16ToF32(h)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			if !math.IsNaN(float64(f)) || F32ToF16(f)&0x7c00 != 0x7c00 || F32ToF16(f)&0x3ff == 0 {
				t.Errorf("NaN %#04x: widened %g, narrowed %#04x", h, f, F32ToF16(f))
			}
			continue
		}
		if got := F32ToF16(f); got != h {
			t.Errorf("F32ToF16(F16ToF32(%#04x) = %g) = %#04x", h, f, got)
		}
		if want := refHalfValue(h); float64(f) != want && !(math.IsInf(want, 0) && math.IsInf(float64(f), 0) && (want > 0) == (f > 0)) {
			t.Errorf("F16ToF32(%#04x) = %g, want %g", h, f, want)
		}
	}
}

// refHalfValue decodes a non-NaN half from its definition in float64.
func refHalfValue(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	switch e {
	case 0x1f:
		return math.Inf(int(sign))
	case 0:
		return sign * math.Ldexp(m, -24)
	}
	return sign * math.Ldexp(1+m/1024, e-15)
}

// refF32ToF16 rounds f to the nearest half by searching the sorted table of
// all non-negative half values in float64 (65536 standing in for Inf, the
// next step past 65504), ties going to the even code.
func refF32ToF16(grid []float64, f float32) uint16 {
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	a := math.Abs(float64(f))
	if math.IsInf(a, 0) || a >= grid[len(grid)-1] {
		return sign | 0x7c00
	}
	k := sort.SearchFloat64s(grid, a) // first grid value >= a
	if grid[k] == a {
		return sign | uint16(k)
	}
	lo, hi := k-1, k
	dlo, dhi := a-grid[lo], grid[hi]-a
	switch {
	case dlo < dhi:
		return sign | uint16(lo)
	case dhi < dlo:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

func TestF32ToF16Reference(t *testing.T) {
	grid := make([]float64, 0x7c01)
	for k := range 0x7c00 {
		grid[k] = refHalfValue(uint16(k))
	}
	grid[0x7c00] = 65536
	var inputs []float32
	// Every midpoint between neighbouring halves, and one f32 ulp either side.
	for k := 0; k < 0x7c00; k++ {
		mid := float32((grid[k] + grid[k+1]) / 2) // exact: needs 12 significant bits
		inputs = append(inputs, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e30), -mid)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		// Any bit pattern, and patterns with exponents around the half range.
		inputs = append(inputs, math.Float32frombits(rng.Uint32()))
		b := rng.Uint32()&0x807fffff | uint32(127-30+rng.IntN(50))<<23
		inputs = append(inputs, math.Float32frombits(b))
	}
	bad := 0
	for _, f := range inputs {
		if math.IsNaN(float64(f)) {
			continue
		}
		if got, want := F32ToF16(f), refF32ToF16(grid, f); got != want {
			if bad++; bad <= 10 {
				t.Errorf("F32ToF16(%g = %#08x) = %#04x, reference %#04x", f, math.Float32bits(f), got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d inputs differ from the reference", bad, len(inputs))
	}
}

func TestBF16(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		want uint16
	}{
		{"one", 1, 0x3f80},
		{"minus two", -2, 0xc000},
		{"exact", 1.5, 0x3fc0},
		{"tie to even down", math.Float32frombits(0x3f808000), 0x3f80},
		{"tie to even up", math.Float32frombits(0x3f818000), 0x3f82},
		{"above tie", math.Float32frombits(0x3f808001), 0x3f81},
		{"max finite rounds to inf", math.MaxFloat32, 0x7f80},
		{"inf", float32(math.Inf(-1)), 0xff80},
		{"subnormal kept", math.Float32frombits(0x00010000), 0x0001},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := F32ToBF16(tc.f); got != tc.want {
				t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
			}
		})
	}
	for _, b := range []uint32{0x7fc00000, 0x7f800001, 0xff800001} {
		if h := F32ToBF16(math.Float32frombits(b)); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
			t.Errorf("F32ToBF16(NaN %#08x) = %#04x, not a NaN", b, h)
		}
	}
	// Every non-NaN bf16 survives widening and narrowing.
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			if !math.IsNaN(float64(BF16ToF32(h))) {
				t.Errorf("BF16ToF32(%#04x) is not NaN", h)
			}
			continue
		}
		if got := F32ToBF16(BF16ToF32(h)); got != h {
			t.Errorf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, got)
		}
	}
	// Random floats against a float64 nearest-even reference.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		b := rng.Uint32()
		if rng.IntN(4) == 0 {
			b = b&0xffff0000 | 0x8000 // force a tie
		}
		f := math.Float32frombits(b)
		if math.IsNaN(float64(f)) {
			continue
		}
		if got, want := F32ToBF16(f), refF32ToBF16(f); got != want {
			t.Fatalf("F32ToBF16(%g = %#08x) = %#04x, reference %#04x", f, b, got, want)
		}
	}
}

// refF32ToBF16 picks the nearer of the two bf16 values around f in float64
// (the step past the largest finite one standing in for Inf).
func refF32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16) // truncation toward zero
	a := math.Abs(float64(f))
	vlo := math.Abs(float64(BF16ToF32(lo)))
	if a == vlo || math.IsInf(a, 0) {
		return lo
	}
	vhi := math.Abs(float64(BF16ToF32(lo + 1)))
	if math.IsInf(vhi, 0) {
		vhi = vlo + (vlo - math.Abs(float64(BF16ToF32(lo-1))))
	}
	switch dlo, dhi := a-vlo, vhi-a; {
	case dlo < dhi:
		return lo
	case dhi < dlo:
		return lo + 1
	case lo%2 == 0:
		return lo
	}
	return lo + 1
}
