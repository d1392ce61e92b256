package kernels

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

func TestRMSNormRoPESoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x, w := randVec(rng, 67, 2), randVec(rng, 67, 1)
	out := make([]float32, 67)
	RMSNorm(out, x, w, 1e-5)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	scale := 1 / math.Sqrt(ss/67+1e-5)
	for i := range x {
		if d := math.Abs(float64(out[i]) - float64(x[i])*scale*float64(w[i])); d > 1e-5 {
			t.Fatalf("rmsnorm[%d] off by %g", i, d)
		}
	}

	const heads, hd, pos = 3, 10, 37
	q := randVec(rng, heads*hd, 1)
	r := append([]float32(nil), q...)
	RoPE(r, heads, hd, pos, 10000)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd; i += 2 {
			ang := pos * math.Pow(10000, -float64(i)/hd)
			a, b := float64(q[h*hd+i]), float64(q[h*hd+i+1])
			w0, w1 := a*math.Cos(ang)-b*math.Sin(ang), a*math.Sin(ang)+b*math.Cos(ang)
			if math.Abs(float64(r[h*hd+i])-w0) > 1e-4 || math.Abs(float64(r[h*hd+i+1])-w1) > 1e-4 {
				t.Fatalf("rope head %d pair %d: (%v,%v), want (%v,%v)", h, i, r[h*hd+i], r[h*hd+i+1], w0, w1)
			}
		}
	}

	s := []float32{1000, 1001, 999, -1e30}
	Softmax(s)
	e := []float64{math.Exp(-1), 1, math.Exp(-2), 0}
	sum := e[0] + e[1] + e[2]
	for i := range s {
		if math.Abs(float64(s[i])-e[i]/sum) > 1e-6 {
			t.Fatalf("softmax %v", s)
		}
	}

	g, u := []float32{-3, 0, 2}, []float32{2, 5, 0.5}
	SiLUMul(g, u)
	for i, gv := range []float64{-3, 0, 2} {
		want := gv / (1 + math.Exp(-gv)) * []float64{2, 5, 0.5}[i]
		if math.Abs(float64(g[i])-want) > 1e-6 {
			t.Fatalf("silu[%d] = %v, want %v", i, g[i], want)
		}
	}
}

// TestSiLUMulIsAccurateAndElementwise holds SwiGLU to the float64
// formula within a few float32 ULPs relative on every backend and level,
// across the range where e^-g under- and overflows, and checks that an
// element's bits do not depend on the length of the call or its place in
// it (the vector bodies and the tails agree): a token's activations must
// not depend on its batch.
func TestSiLUMulIsAccurateAndElementwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	const n = 1000
	gate, up := make([]float32, n), make([]float32, n)
	for i := range gate {
		switch i % 4 {
		case 0:
			gate[i] = float32(rng.NormFloat64() * 3)
		case 1:
			gate[i] = float32(200*rng.Float64() - 100)
		default:
			gate[i] = float32(20*rng.Float64() - 10)
		}
		up[i] = float32(rng.NormFloat64())
	}
	gate[0], gate[1], gate[2], gate[3] = 0, -87.5, 88.5, -200
	for _, be := range testBackends() {
		t.Run(be, func(t *testing.T) {
			defer useBackend(t, be)()
			all := slices.Clone(gate)
			SiLUMul(all, up)
			for i, got := range all {
				g := float64(gate[i])
				want := g / (1 + math.Exp(-g)) * float64(up[i])
				if math.Abs(want) < 1e-30 {
					if math.Abs(float64(got)) > 1e-30 {
						t.Fatalf("silu(%v)·%v = %v, want %v", gate[i], up[i], got, want)
					}
				} else if rel := math.Abs(float64(got)-want) / math.Abs(want); rel > 4e-6 {
					t.Fatalf("silu(%v)·%v = %v, want %v (relative error %.2g)", gate[i], up[i], got, want, rel)
				}
			}
			// Every element alone, and runs of every length from every
			// start: the same bits as in the long call.
			for start := 0; start < 40; start++ {
				for length := 1; start+length <= 40; length++ {
					part := slices.Clone(gate[start : start+length])
					SiLUMul(part, up[start:start+length])
					for j, got := range part {
						if math.Float32bits(got) != math.Float32bits(all[start+j]) {
							t.Fatalf("element %d in a call of %d from %d: %v, in the long call %v", start+j, length, start, got, all[start+j])
						}
					}
				}
			}
		})
	}
}

// TestExpSumIsAccurateAndElementwise holds ExpSum to float64's e^(x−m)
// within a few float32 ULPs relative on every backend and level, from 1
// down to where the result leaves float32's normal range (results below
// it may be flushed to 0), with -Inf giving 0. The sum must be the sum of
// the results, and an element's bits must not depend on the length of
// the call or its place in it: a sampler's distribution over a token
// must not depend on the vocabulary around it.
func TestExpSumIsAccurateAndElementwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	const n = 1003
	x := make([]float32, n)
	for i := range x {
		switch i % 3 {
		case 0:
			x[i] = float32(rng.NormFloat64() * 4)
		case 1:
			x[i] = float32(-120 * rng.Float64())
		default:
			x[i] = float32(20*rng.Float64() - 10)
		}
	}
	x[0], x[1], x[2] = float32(math.Inf(-1)), -87.3, 11
	m := float32(11)
	for _, be := range testBackends() {
		t.Run(be, func(t *testing.T) {
			defer useBackend(t, be)()
			all := slices.Clone(x)
			sum := ExpSum(all, m)
			var want64 float64
			for i, got := range all {
				want := math.Exp(float64(x[i] - m)) // the difference rounded to float32, as the kernels take it
				switch {
				case want < 0x1p-126:
					if got != 0 && math.Abs(float64(got)-want) > 0x1p-149 {
						t.Fatalf("e^(%v-%v) = %v, want %v or 0", x[i], m, got, want)
					}
				case math.Abs(float64(got)-want)/want > 4e-7:
					t.Fatalf("e^(%v-%v) = %v, want %v (relative error %.2g)", x[i], m, got, want, math.Abs(float64(got)-want)/want)
				}
				want64 += float64(got)
			}
			if math.Abs(sum-want64) > 1e-12*want64 {
				t.Fatalf("sum %v, the results add up to %v", sum, want64)
			}
			for start := 0; start < 40; start++ {
				for length := 1; start+length <= 40; length++ {
					part := slices.Clone(x[start : start+length])
					ExpSum(part, m)
					for j, got := range part {
						if math.Float32bits(got) != math.Float32bits(all[start+j]) {
							t.Fatalf("element %d in a call of %d from %d: %v, in the long call %v", start+j, length, start, got, all[start+j])
						}
					}
				}
			}
		})
	}
	if got := ExpSum(nil, 0); got != 0 {
		t.Errorf("ExpSum(nil) = %v, want 0", got)
	}
}

// refAttention is the float64 reference over the given KV rows.
func refAttention(q, k, v []float32, stride, off int, use []int, scale float32) []float64 {
	hd := len(q)
	sc := make([]float64, len(use))
	mx := math.Inf(-1)
	for i, r := range use {
		for d := 0; d < hd; d++ {
			sc[i] += float64(q[d]) * float64(k[r*stride+off+d])
		}
		sc[i] *= float64(scale)
		mx = max(mx, sc[i])
	}
	var sum float64
	for i := range sc {
		sc[i] = math.Exp(sc[i] - mx)
		sum += sc[i]
	}
	want := make([]float64, hd)
	for i, r := range use {
		for d := 0; d < hd; d++ {
			want[d] += sc[i] / sum * float64(v[r*stride+off+d])
		}
	}
	return want
}

// Attention over a prefix plus tree ancestors equals attention over the
// same rows gathered densely, in F32 and F16, on every backend.
func TestAttentionTreeRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cases := []struct {
		hd, prefix int
		extra      []int32
	}{
		{12, 4, []int32{6, 8}},
		{7, 1, nil},
		{64, 37, []int32{40, 45, 46}},
		{67, 0, []int32{3, 1, 9}},
		{128, 300, []int32{301}},
	}
	for _, c := range cases {
		const kvHeads = 3
		stride, off := kvHeads*c.hd, c.hd // the middle KV head
		rows := c.prefix
		use := make([]int, 0, c.prefix+len(c.extra))
		for i := 0; i < c.prefix; i++ {
			use = append(use, i)
		}
		for _, e := range c.extra {
			rows = max(rows, int(e)+1)
			use = append(use, int(e))
		}
		k, v := randVec(rng, rows*stride, 1), randVec(rng, rows*stride, 1)
		q := randVec(rng, c.hd, 2)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		want := refAttention(q, k, v, stride, off, use, scale)
		k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
		kr, vr := make([]float32, len(k)), make([]float32, len(v)) // the F16 values
		for i := range k {
			k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
			kr[i], vr[i] = weights.F16ToF32(k16[i]), weights.F16ToF32(v16[i])
		}
		want16 := refAttention(q, kr, vr, stride, off, use, scale)
		for _, be := range testBackends() {
			t.Run(fmt.Sprintf("%s/hd=%d/prefix=%d/extra=%d", be, c.hd, c.prefix, len(c.extra)), func(t *testing.T) {
				defer useBackend(t, be)()
				out := make([]float32, c.hd)
				Attention(out, q, k, v, 1, stride, off, c.prefix, c.extra, scale, make([]float32, len(use)))
				out16 := make([]float32, c.hd)
				AttentionF16(out16, q, k16, v16, 1, stride, off, c.prefix, c.extra, scale, make([]float32, len(use)))
				for d := 0; d < c.hd; d++ {
					if math.Abs(float64(out[d])-want[d]) > 2e-6 {
						t.Fatalf("f32 attention[%d] = %v, want %v", d, out[d], want[d])
					}
					if math.Abs(float64(out16[d])-want16[d]) > 2e-6 {
						t.Fatalf("f16 attention[%d] = %v, want %v (on the f16-rounded cache)", d, out16[d], want16[d])
					}
				}
			})
		}
	}
}

// TestAttentionSoftmaxIsAccurate reads attention's probabilities back
// directly (V is the identity, so out = softmax of the scores) and holds
// each to the float64 softmax within a few float32 ULPs relative, down to
// the smallest ones: the C backends' vectorised exp must not trade
// accuracy for speed where an absolute check would not see it. Spreads
// reach past where e^x leaves float32's normal range, rows end at every
// offset within a vector, and scores sit far from 0 (the max is taken
// out first).
func TestAttentionSoftmaxIsAccurate(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{1, 7, 8, 9, 13, 37, 100} {
		for _, spread := range []float64{1, 20, 86, 120} {
			scores := make([]float64, n)
			k, v := make([]float32, n*n), make([]float32, n*n)
			for i := range scores {
				scores[i] = 50 - spread*rng.Float64()
				k[i*n] = float32(scores[i])
				scores[i] = float64(k[i*n])
				v[i*n+i] = 1
			}
			q := make([]float32, n)
			q[0] = 1
			mx := slices.Max(scores)
			var sum float64
			for _, x := range scores {
				sum += math.Exp(x - mx)
			}
			for _, be := range testBackends() {
				t.Run(fmt.Sprintf("%s/n=%d/spread=%v", be, n, spread), func(t *testing.T) {
					defer useBackend(t, be)()
					out := make([]float32, n)
					Attention(out, q, k, v, 1, n, 0, n, nil, 1, make([]float32, n))
					for i, got := range out {
						want := math.Exp(scores[i]-mx) / sum
						if want < 0x1p-126 { // below float32's normal range: 0 or a subnormal will do
							if float64(got) > 0x1p-126 {
								t.Fatalf("p[%d] = %v, want %v", i, got, want)
							}
							continue
						}
						if rel := math.Abs(float64(got)-want) / want; rel > 4e-6 {
							t.Fatalf("p[%d] = %v, want %v (relative error %.2g)", i, got, want, rel)
						}
					}
				})
			}
		}
	}
}

// Rows with equal keys get equal probabilities, to the bit, whichever way
// their scores were reduced: the AVX2 kernel sums eight rows' products
// at a time and the rows past the last eight one at a time, and decode
// and tree verification put a KV row at different places in those
// blocks only if the two orders agree. V is zero except a 1 for the
// first row (in a block) and for the last (alone), so the output reads
// back those two rows' probabilities.
func TestAttentionRowBlocksMatchLoneRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, hd := range []int{8, 16, 24, 32, 64, 12} {
		for _, heads := range []int{1, 2, 5} {
			for _, n := range []int{9, 15, 17, 30} {
				stride := hd
				key := randVec(rng, hd, 1)
				k := make([]float32, n*stride)
				for r := range n {
					copy(k[r*stride:], key)
				}
				v := make([]float32, n*stride)
				v[0], v[(n-1)*stride+1] = 1, 1
				k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
				for i := range k {
					k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
				}
				q := randVec(rng, heads*hd, 2)
				// The last three rows as tree ancestors, the rest a prefix.
				prefix, extra := n-3, []int32{int32(n - 3), int32(n - 2), int32(n - 1)}
				for _, be := range testBackends() {
					restore := useBackend(t, be)
					for _, f16 := range []bool{false, true} {
						out := make([]float32, heads*hd)
						if f16 {
							AttentionF16(out, q, k16, v16, heads, stride, 0, prefix, extra, 0.3, make([]float32, heads*n))
						} else {
							Attention(out, q, k, v, heads, stride, 0, prefix, extra, 0.3, make([]float32, heads*n))
						}
						for h := range heads {
							first, last := out[h*hd], out[h*hd+1]
							if math.Float32bits(first) != math.Float32bits(last) {
								t.Errorf("%s f16 %v hd %d heads %d rows %d, head %d: first row's probability %v, last row's %v",
									be, f16, hd, heads, n, h, first, last)
							}
						}
					}
					restore()
				}
			}
		}
	}
}

// Heads that share a KV head, attended together, give each head the bits
// it gets attended alone (decode and tree verification batch heads
// differently, and a verified tree promises decode's tokens), on every
// backend, F32 and F16, and match the float64 reference.
func TestAttentionGroupedHeadsMatchLoneHeads(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	cases := []struct {
		heads, hd, prefix int
		extra             []int32
	}{
		{8, 64, 200, []int32{203, 207}},
		{3, 12, 5, nil},
		{4, 67, 0, []int32{2, 0}},
		{2, 128, 33, []int32{40}},
	}
	for _, c := range cases {
		const kvHeads = 2
		stride, off := kvHeads*c.hd, c.hd // the second KV head
		rows := c.prefix
		use := make([]int, 0, c.prefix+len(c.extra))
		for i := range c.prefix {
			use = append(use, i)
		}
		for _, e := range c.extra {
			rows = max(rows, int(e)+1)
			use = append(use, int(e))
		}
		k, v := randVec(rng, rows*stride, 1), randVec(rng, rows*stride, 1)
		k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
		for i := range k {
			k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
		}
		q := randVec(rng, c.heads*c.hd, 2)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		n := len(use)
		for _, be := range testBackends() {
			t.Run(fmt.Sprintf("%s/heads=%d/hd=%d/rows=%d", be, c.heads, c.hd, n), func(t *testing.T) {
				defer useBackend(t, be)()
				for _, f16 := range []bool{false, true} {
					group := make([]float32, c.heads*c.hd)
					// Scratch starts dirty: the kernel must not read it.
					scores := randVec(rng, c.heads*n, 1)
					if f16 {
						AttentionF16(group, q, k16, v16, c.heads, stride, off, c.prefix, c.extra, scale, scores)
					} else {
						Attention(group, q, k, v, c.heads, stride, off, c.prefix, c.extra, scale, scores)
					}
					for h := range c.heads {
						alone := make([]float32, c.hd)
						qh := q[h*c.hd : (h+1)*c.hd]
						if f16 {
							AttentionF16(alone, qh, k16, v16, 1, stride, off, c.prefix, c.extra, scale, make([]float32, n))
						} else {
							Attention(alone, qh, k, v, 1, stride, off, c.prefix, c.extra, scale, make([]float32, n))
						}
						want := refAttention(qh, k, v, stride, off, use, scale)
						for d := range c.hd {
							got := group[h*c.hd+d]
							if math.Float32bits(got) != math.Float32bits(alone[d]) {
								t.Fatalf("f16 %v head %d [%d]: %v grouped, %v alone", f16, h, d, got, alone[d])
							}
							if tol := 2e-6 + 2e-3*b2f(f16); math.Abs(float64(got)-want[d]) > tol {
								t.Fatalf("f16 %v head %d [%d] = %v, want %v", f16, h, d, got, want[d])
							}
						}
					}
				}
			})
		}
	}
}

// b2f is 1 for true: the F16 cache's rounding widens the tolerance.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// treeRows lists each of n slots' rows after a prefix as the model does:
// a slot's ancestors root first, then its own row (prefix + its index).
// A slot whose parent's list ends anc extends it in place (a chain shares
// one run), else it copies it, so ranges overlap as in a prefill.
func treeRows(rng *rand.Rand, prefix, n int, chain bool) (anc []int32, lo, hi []int) {
	for j := range n {
		p := j - 1
		if !chain {
			p = rng.IntN(j+1) - 1 // -1: a root
		}
		var l int
		switch {
		case p < 0:
			l = len(anc)
		case hi[p] == len(anc):
			l = lo[p]
		default:
			l = len(anc)
			anc = append(anc, anc[lo[p]:hi[p]]...)
		}
		anc = append(anc, int32(prefix+j))
		lo, hi = append(lo, l), append(hi, len(anc))
	}
	return anc, lo, hi
}

// A tree's slots attended together (the prefix's rows read once for all)
// give each slot the bits it gets attended alone, as tree verification
// promises decode's tokens: chains and branching trees, prefixes shorter
// and longer than the kernel's 64-row tile, head dimensions with and
// without a scalar tail, F32 and F16, on every backend; and the backends
// agree with each other.
func TestAttentionTreeMatchesLoneSlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, hd := range []int{8, 12, 64} {
		for _, heads := range []int{1, 2, 3, 8} {
			for _, prefix := range []int{0, 1, 9, 64, 130} {
				for _, slots := range []int{1, 2, 5, 9} {
					chain := rng.IntN(2) == 0
					anc, lo, hi := treeRows(rng, prefix, slots, chain)
					const kvHeads = 2
					stride, off := kvHeads*hd, hd // the second KV head
					rows := prefix + slots
					k, v := randVec(rng, rows*stride, 1), randVec(rng, rows*stride, 1)
					k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
					for i := range k {
						k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
					}
					// Groups sit qs apart with a gap, as a head group's
					// queries do in the model's rows of all heads.
					qs := heads*hd + 5
					q := randVec(rng, (slots-1)*qs+heads*hd, 2)
					scale := float32(1 / math.Sqrt(float64(hd)))
					ld := treeWidth(prefix, lo, hi)
					name := fmt.Sprintf("hd %d heads %d prefix %d slots %d chain %v", hd, heads, prefix, slots, chain)
					byBackend := map[string][2][]float32{}
					for _, be := range testBackends() {
						restore := useBackend(t, be)
						var got [2][]float32
						for fi, f16 := range []bool{false, true} {
							out := randVec(rng, len(q), 1) // dirty: the gaps must stay as they were
							gaps := slices.Clone(out)
							scores := randVec(rng, slots*heads*ld, 1)
							if f16 {
								AttentionTreeF16(out, q, k16, v16, heads, slots, qs, stride, off, prefix, anc, lo, hi, scale, scores)
							} else {
								AttentionTree(out, q, k, v, heads, slots, qs, stride, off, prefix, anc, lo, hi, scale, scores)
							}
							for g := range slots {
								alone := make([]float32, heads*hd)
								qg := q[g*qs : g*qs+heads*hd]
								extra := anc[lo[g]:hi[g]]
								n := prefix + len(extra)
								if f16 {
									AttentionF16(alone, qg, k16, v16, heads, stride, off, prefix, extra, scale, make([]float32, heads*n))
								} else {
									Attention(alone, qg, k, v, heads, stride, off, prefix, extra, scale, make([]float32, heads*n))
								}
								for d, want := range alone {
									if got := out[g*qs+d]; math.Float32bits(got) != math.Float32bits(want) {
										t.Fatalf("%s: %s f16 %v slot %d [%d]: %v in the tree, %v alone", be, name, f16, g, d, got, want)
									}
								}
								if g < slots-1 {
									for d := g*qs + heads*hd; d < (g+1)*qs; d++ {
										if out[d] != gaps[d] {
											t.Fatalf("%s: %s f16 %v: wrote between groups at %d", be, name, f16, d)
										}
									}
								}
							}
							got[fi] = out
						}
						byBackend[be] = got
						restore()
					}
					g := byBackend["go"]
					for be, c := range byBackend {
						for fi := range c {
							for g0 := range slots {
								for d := g0 * qs; d < g0*qs+heads*hd; d++ {
									if diff := math.Abs(float64(c[fi][d] - g[fi][d])); diff > 1e-5 {
										t.Fatalf("%s f16 %v [%d]: %s %v, go %v", name, fi == 1, d, be, c[fi][d], g[fi][d])
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

func TestAttentionTreePanicsOnBadGroups(t *testing.T) {
	k, v := make([]float32, 80), make([]float32, 80)
	q := make([]float32, 2*8)
	cases := []struct {
		name        string
		groups, qs  int
		anc         []int32
		lo, hi      []int
		scores, out int
	}{
		{"ranges for fewer groups", 2, 8, []int32{2, 3}, []int{0}, []int{1}, 16, 16},
		{"range past anc", 2, 8, []int32{2, 3}, []int{0, 1}, []int{1, 3}, 16, 16},
		{"backwards range", 2, 8, []int32{2, 3}, []int{1, 1}, []int{1, 0}, 16, 16},
		{"groups overlap", 2, 4, []int32{2, 3}, []int{0, 1}, []int{1, 2}, 16, 16},
		{"short scores", 2, 8, []int32{2, 3}, []int{0, 1}, []int{1, 2}, 5, 16},
		{"short output", 2, 8, []int32{2, 3}, []int{0, 1}, []int{1, 2}, 16, 15},
		{"no groups", 0, 8, []int32{2, 3}, nil, nil, 16, 16},
		{"two groups without ranges", 2, 8, []int32{2, 3}, nil, nil, 16, 16},
		{"row past K", 2, 8, []int32{2, 10}, []int{0, 1}, []int{1, 2}, 16, 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			qq := q
			if c.qs != 8 && c.groups == 2 {
				qq = q[:c.qs+8]
			}
			AttentionTree(make([]float32, c.out), qq, k, v, 1, c.groups, c.qs, 8, 0, 2, c.anc, c.lo, c.hi, 1, make([]float32, c.scores))
		})
	}
}

func TestAttentionPanicsOnBadRows(t *testing.T) {
	k, v := make([]float32, 40), make([]float32, 40)
	cases := []struct {
		name       string
		heads, out int // default 1 head, an output of 8
		prefix     int
		extra      []int32
		scores     int
	}{
		{"row past K", 0, 0, 6, nil, 6},
		{"extra past K", 0, 0, 1, []int32{5}, 2},
		{"negative extra", 0, 0, 1, []int32{-1}, 2},
		{"short scores", 0, 0, 3, nil, 2},
		{"no rows", 0, 0, 0, nil, 1},
		{"heads do not divide q", 3, 0, 2, nil, 6},
		{"no heads", -1, 0, 2, nil, 6},
		{"short scores for the heads", 2, 0, 2, nil, 3},
		{"short output", 0, 7, 2, nil, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			heads, out := cmp.Or(c.heads, 1), cmp.Or(c.out, 8)
			Attention(make([]float32, out), make([]float32, 8), k, v, heads, 8, 0, c.prefix, c.extra, 1, make([]float32, c.scores))
		})
	}
}

func TestBackendSelection(t *testing.T) {
	defer SetBackend(Backends()[0])
	if err := SetBackend("go"); err != nil || Backend() != "go" {
		t.Fatal(err)
	}
	if err := SetBackend("cuda"); err == nil {
		t.Error("unknown backend accepted")
	}
}

func TestAddAndRMSNormInPlace(t *testing.T) {
	dst, x := []float32{1, 2, 3}, []float32{0.5, -2, 1e-3}
	Add(dst, x)
	for i, want := range []float32{1.5, 0, 3.001} {
		if dst[i] != want {
			t.Fatalf("Add: dst[%d] = %v, want %v", i, dst[i], want)
		}
	}
	// out aliasing x gives the same result as a separate output.
	rng := rand.New(rand.NewPCG(13, 14))
	v, w := randVec(rng, 33, 3), randVec(rng, 33, 1)
	sep := make([]float32, len(v))
	RMSNorm(sep, v, w, 1e-6)
	RMSNorm(v, v, w, 1e-6)
	for i := range v {
		if v[i] != sep[i] {
			t.Fatalf("in-place RMSNorm[%d] = %v, separate %v", i, v[i], sep[i])
		}
	}
	// eps keeps an all-zero vector finite.
	z := make([]float32, 4)
	RMSNorm(z, z, []float32{1, 1, 1, 1}, 1e-5)
	for _, e := range z {
		if e != 0 {
			t.Fatalf("RMSNorm of zeros = %v", z)
		}
	}
}

// TestRoPEAnglesMatchTheReferenceSteps pins the rotation bit for bit to
// llama2.c's float32 steps, computed here pair by pair as it does, so
// computing the angles once per forward pass cannot change an output.
func TestRoPEAnglesMatchTheReferenceSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		heads, hd int
		theta     float32
	}{{8, 8, 10000}, {4, 64, 10000}, {2, 128, 500000}, {3, 6, 1e6}} {
		for _, pos := range []int{0, 1, 37, 511, 4095, 131071} {
			x := randVec(rng, tc.heads*tc.hd, 1)
			want := append([]float32(nil), x...)
			for i := 0; i < tc.hd; i += 2 {
				freq := 1 / float32(math.Pow(float64(tc.theta), float64(float32(i)/float32(tc.hd))))
				sin, cos := math.Sincos(float64(float32(pos) * freq))
				c, s := float32(cos), float32(sin)
				for h := range tc.heads {
					v0, v1 := want[h*tc.hd+i], want[h*tc.hd+i+1]
					want[h*tc.hd+i] = v0*c - v1*s
					want[h*tc.hd+i+1] = v0*s + v1*c
				}
			}
			got := append([]float32(nil), x...)
			RoPE(got, tc.heads, tc.hd, pos, tc.theta)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("heads %d × %d, θ %g, pos %d: x[%d] = %v, want %v bit for bit", tc.heads, tc.hd, tc.theta, pos, i, got[i], want[i])
				}
			}
		}
	}
}
