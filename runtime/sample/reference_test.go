package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// probsRef is Probs as it was before ranking read only the head of the
// order: it sorts the whole vocabulary. The fast path must give the same
// bits for every input (TestProbsMatchReference, FuzzProbsMatchReference).
// One part is newer than that: the temperature scales the logits'
// distances from the largest, which no temperature overflows.
func probsRef(opt Options, logits []float32, history []int32) []float32 {
	s := New(opt)
	dst := append([]float32(nil), logits...)
	for i, x := range dst {
		if x != x {
			dst[i] = float32(math.Inf(-1))
		}
	}
	s.penalize(dst, history)
	if s.Greedy() {
		best := argmax(dst)
		clear(dst)
		dst[best] = 1
		return dst
	}
	// Distances from the largest, scaled: no temperature overflows them.
	if m := slices.Max(dst); !math.IsInf(float64(m), 0) {
		inv := 1 / opt.Temperature
		for i, x := range dst {
			switch {
			case x == m:
				dst[i] = 0
			case math.IsInf(float64(x), -1):
			default:
				dst[i] = (x - m) * inv
			}
		}
	}
	n := len(dst)
	k := min(opt.TopK, n)
	topP := opt.TopP > 0 && opt.TopP < 1
	var idx []int32
	if k > 0 || topP {
		for i := range dst {
			idx = append(idx, int32(i))
		}
		slices.SortStableFunc(idx, func(a, b int32) int {
			switch {
			case dst[a] > dst[b]:
				return -1
			case dst[a] < dst[b]:
				return 1
			}
			return 0
		})
	}
	if k > 0 {
		for _, id := range idx[k:] {
			dst[id] = float32(math.Inf(-1))
		}
	}
	softmax(dst)
	if topP {
		var acc float64
		cut := len(idx)
		for i, id := range idx {
			acc += float64(dst[id])
			if acc >= float64(opt.TopP) {
				cut = i + 1
				break
			}
		}
		for _, id := range idx[cut:] {
			dst[id] = 0
		}
	}
	if opt.MinP > 0 {
		floor := min(opt.MinP, 1) * dst[argmax(dst)]
		for i, p := range dst {
			if p < floor {
				dst[i] = 0
			}
		}
	}
	normalize(dst)
	return dst
}

// probeLogits are vocabularies that reach every path: a model's shape,
// flat ones (top-p ranks past its head), many ties, infinities and NaN.
func probeLogits(n int, seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	flat := make([]float32, n)
	ties := make([]float32, n)
	odd := make([]float32, n)
	ninf := make([]float32, n)
	for i := range n {
		flat[i] = float32(r.Float64() * 0.01)
		ties[i] = float32(r.IntN(4))
		switch r.IntN(6) {
		case 0:
			odd[i] = float32(math.NaN())
		case 1:
			odd[i] = float32(math.Inf(-1))
		case 2:
			odd[i] = float32(math.Inf(1))
		default:
			odd[i] = float32(r.NormFloat64())
		}
		ninf[i] = float32(math.Inf(-1))
	}
	return [][]float32{lmLogits(n, seed), flat, ties, odd, ninf}
}

func probeOptions(n int) []Options {
	temps := []float32{0, 0.8, 1.7, 1e-40}
	if n > 1000 {
		temps = temps[:2] // a Llama vocabulary's full sorts take a while under -race
	}
	var opts []Options
	for _, temp := range temps {
		for _, k := range []int{0, 1, 3, 40, n - 1, n, n + 5} {
			for _, p := range []float32{0, 0.3, 0.95, 0.9999, 1} {
				opts = append(opts, Options{Temperature: temp, TopK: k, TopP: p})
			}
		}
	}
	return append(opts,
		Options{Temperature: 0.8, TopP: 0.95, MinP: 0.05},
		Options{Temperature: 0.8, TopP: 0.95, RepeatPenalty: 1.3, RepeatLastN: 16},
		Options{RepeatPenalty: 1.3},
		Options{Temperature: 0.8, RepeatPenalty: 0.5}, // below 1 a repeated token gains
		Options{Temperature: 0.8, TopK: 3, RepeatPenalty: 1.3},
	)
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestProbsMatchReference checks that ranking only the head of the
// vocabulary changes no bit of any distribution, and that greedy Sample,
// which reads the logits in place, picks the reference's token.
func TestProbsMatchReference(t *testing.T) {
	for _, n := range []int{1, 2, 7, 64, 65, 512, 600, 32000} {
		for li, logits := range probeLogits(n, uint64(n)) {
			// The second history holds the largest logit, which the
			// penalty then lowers (or raises, below 1).
			histories := [][]int32{{0, int32(n / 2), int32(n - 1), int32(n / 2)}, {int32(n / 3), argmax(logits)}}
			for _, opt := range probeOptions(n) {
				hs := histories[:1]
				if opt.RepeatPenalty != 0 {
					hs = histories
				}
				for _, history := range hs {
					want := probsRef(opt, logits, history)
					s := New(opt)
					if got := s.Probs(logits, history); !sameBits(got, want) {
						t.Fatalf("vocab %d, logits %d, history %v, %+v: Probs differs from the full sort's", n, li, history, opt)
					}
					// Twice on one sampler: its buffers carry nothing over.
					if got := s.Probs(logits, history); !sameBits(got, want) {
						t.Fatalf("vocab %d, logits %d, history %v, %+v: a second Probs differs", n, li, history, opt)
					}
					if err := drawReadsProbs(opt, logits, history); err != nil {
						t.Fatalf("vocab %d, logits %d, history %v, %+v: %v", n, li, history, opt, err)
					}
					if opt.Temperature == 0 {
						if got, want := s.Sample(logits, history), argmax(want); got != want {
							t.Fatalf("vocab %d, logits %d, history %v, %+v: greedy Sample %d, want %d", n, li, history, opt, got, want)
						}
					}
				}
			}
		}
	}
}

// drawReadsProbs checks that the shape Sample draws from, which writes
// only the cut's probabilities, has the cut and the bits at it that
// Probs's full shape has.
func drawReadsProbs(opt Options, logits []float32, history []int32) error {
	full, cut := New(opt).shape(nil, logits, history, true)
	part, partCut := New(opt).shape(nil, logits, history, false)
	if !slices.Equal(cut, partCut) {
		return fmt.Errorf("the draw's shape cuts at %v, Probs's at %v", partCut, cut)
	}
	ids := cut
	if ids == nil {
		for i := range full {
			ids = append(ids, int32(i))
		}
	}
	for _, i := range ids {
		if math.Float32bits(part[i]) != math.Float32bits(full[i]) {
			return fmt.Errorf("token %d: the draw's shape has %g, Probs's %g", i, part[i], full[i])
		}
	}
	return nil
}

// FuzzProbsMatchReference compares Probs with the full sort's on any
// logits and options.
func FuzzProbsMatchReference(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64}, float32(0.8), 2, float32(0.9), float32(0), float32(1))
	f.Add([]byte{0, 0, 192, 127, 0, 0, 128, 255, 0, 0, 128, 127, 1, 2, 3, 4}, float32(1), 0, float32(0.5), float32(0.1), float32(1.2))
	f.Fuzz(func(t *testing.T, raw []byte, temp float32, k int, p, minP, pen float32) {
		logits := make([]float32, len(raw)/4)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		if len(logits) == 0 {
			return
		}
		opt := Options{Temperature: temp, TopK: k % 1000, TopP: p, MinP: minP, RepeatPenalty: pen, RepeatLastN: 8}
		history := []int32{0, int32(len(logits) - 1)}
		if got, want := New(opt).Probs(logits, history), probsRef(opt, logits, history); !sameBits(got, want) {
			t.Fatalf("%+v on %v: Probs %v, the full sort's %v", opt, logits, got, want)
		}
		if err := drawReadsProbs(opt, logits, history); err != nil {
			t.Fatalf("%+v on %v: %v", opt, logits, err)
		}
		if temp <= 0 || temp != temp {
			if got, want := New(opt).Sample(logits, history), argmax(probsRef(opt, logits, history)); got != want {
				t.Fatalf("%+v on %v: greedy Sample %d, want %d", opt, logits, got, want)
			}
		}
	})
}

// FuzzRaceOnLogits compares Sample, which races the logits when there is
// no top-k or top-p, with Draw on Probs for the same word, on any logits,
// temperature, min-p, penalty and seed (sampleVersusDraw).
func FuzzRaceOnLogits(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64}, float32(0.8), float32(0), float32(1), uint64(1))
	f.Add([]byte{0, 0, 192, 127, 0, 0, 128, 255, 0, 0, 128, 127, 1, 2, 3, 4}, float32(1), float32(0.1), float32(1.2), uint64(7))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128, 191}, float32(1e-39), float32(0.5), float32(0), uint64(3))
	f.Fuzz(func(t *testing.T, raw []byte, temp, minP, pen float32, seed uint64) {
		logits := make([]float32, len(raw)/4)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		if len(logits) == 0 || !(temp > 0) {
			return
		}
		opt := Options{Temperature: temp, MinP: minP, RepeatPenalty: pen, RepeatLastN: 8, Seed: seed}
		if _, err := sampleVersusDraw(opt, logits, []int32{0, int32(len(logits) - 1)}); err != nil {
			t.Fatalf("on %v: %v", logits, err)
		}
	})
}

// FuzzSampleIsTheDraw compares Sample with Draw on Probs for the same word
// with every transform, top-k and top-p included (sampleVersusDraw).
func FuzzSampleIsTheDraw(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64}, float32(0.8), 2, float32(0.9), float32(0), float32(1), uint64(1))
	f.Add([]byte{0, 0, 192, 127, 0, 0, 128, 255, 0, 0, 128, 127, 1, 2, 3, 4}, float32(1), 0, float32(0.5), float32(0.1), float32(1.2), uint64(7))
	f.Fuzz(func(t *testing.T, raw []byte, temp float32, k int, p, minP, pen float32, seed uint64) {
		logits := make([]float32, len(raw)/4)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		if len(logits) == 0 || !(temp > 0) {
			return
		}
		opt := Options{Temperature: temp, TopK: k % 1000, TopP: p, MinP: minP, RepeatPenalty: pen, RepeatLastN: 8, Seed: seed}
		if _, err := sampleVersusDraw(opt, logits, []int32{0, int32(len(logits) - 1)}); err != nil {
			t.Fatalf("on %v: %v", logits, err)
		}
	})
}

// softmax turns logits into probabilities in place for the reference:
// the kernels' exponentials and a float64 sum, as the sampler's weights
// and its normalising multiply make them.
func softmax(x []float32) {
	inv := weights(x, x[argmax(x)])
	for i := range x {
		x[i] = float32(float64(x[i]) * inv)
	}
}
