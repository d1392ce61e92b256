package sample

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// softmaxRef is the textbook softmax of logits/temp in float64.
func softmaxRef(logits []float32, temp float64) []float64 {
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v)/temp)
	}
	out := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		out[i] = math.Exp(float64(v)/temp - m)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func TestGreedy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		logits  []float32
		history []int32
		opt     Options
		want    int32
	}{
		{"max", []float32{0.1, 3, -2, 2.9}, nil, Options{}, 1},
		{"tie goes to lowest id", []float32{1, 5, 5, 5}, nil, Options{}, 1},
		{"negative temperature is greedy", []float32{1, 2, 0}, nil, Options{Temperature: -1}, 1},
		{"NaN never wins", []float32{float32(math.NaN()), 1, 2}, nil, Options{}, 2},
		{"repeat penalty moves the max", []float32{1, 4, 3}, []int32{1}, Options{RepeatPenalty: 2}, 2},
		{"penalty window excludes old tokens", []float32{1, 4, 3}, []int32{1, 0, 0}, Options{RepeatPenalty: 2, RepeatLastN: 2}, 1},
		{"out-of-vocab history ignored", []float32{1, 4, 3}, []int32{-5, 99}, Options{RepeatPenalty: 2}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.opt)
			in := append([]float32(nil), tc.logits...)
			if got := s.Sample(in, tc.history); got != tc.want {
				t.Fatalf("Sample = %d, want %d", got, tc.want)
			}
			for i := range in {
				if math.Float32bits(in[i]) != math.Float32bits(tc.logits[i]) {
					t.Fatalf("Sample modified the logits: %v", in)
				}
			}
			p := s.Probs(tc.logits, tc.history)
			for i, v := range p {
				want := float32(0)
				if int32(i) == tc.want {
					want = 1
				}
				if v != want {
					t.Fatalf("greedy Probs = %v, want one-hot at %d", p, tc.want)
				}
			}
		})
	}
	if got := New(Options{}).Sample(nil, nil); got != -1 {
		t.Fatalf("Sample(empty) = %d, want -1", got)
	}
}

func TestRepeatPenaltySign(t *testing.T) {
	// Positive logits are divided, negative ones multiplied, each distinct
	// token once however often it repeats.
	s := New(Options{Temperature: 1, RepeatPenalty: 2})
	logits := []float32{2, -1, 0.5}
	got := s.Probs(logits, []int32{0, 0, 1, 0})
	want := softmaxRef([]float32{1, -2, 0.5}, 1)
	for i := range want {
		if !near(float64(got[i]), want[i], 1e-6) {
			t.Fatalf("Probs = %v, want %v", got, want)
		}
	}
}

// TestPenaltyTiesGoToTheLowerId: a repeated token that a penalty below 1
// raises to the largest logit ties with it, and greedy decoding takes the
// lower id, as argmax over the whole vocabulary does.
func TestPenaltyTiesGoToTheLowerId(t *testing.T) {
	logits := []float32{2, 4, 1}
	for _, history := range [][]int32{{0}, {2, 0}} {
		s := New(Options{RepeatPenalty: 0.5}) // 2 / 0.5 = 4
		if got := s.Sample(logits, history); got != 0 {
			t.Errorf("history %v: greedy Sample %d, want 0 (tied at 4 with 1)", history, got)
		}
		if p := s.Probs(logits, history); p[0] != 1 {
			t.Errorf("history %v: Probs %v, want one-hot on 0", history, p)
		}
	}
}

func TestTransforms(t *testing.T) {
	logits := []float32{1, 3, 2, 0, 2.5, -1}
	for _, tc := range []struct {
		name string
		opt  Options
		keep []int // ids that keep probability, renormalized from softmax(logits/T)
		temp float64
	}{
		{"temperature only", Options{Temperature: 0.5}, []int{0, 1, 2, 3, 4, 5}, 0.5},
		{"top-k 2", Options{Temperature: 1, TopK: 2}, []int{1, 4}, 1},
		{"top-k past vocab", Options{Temperature: 1, TopK: 100}, []int{0, 1, 2, 3, 4, 5}, 1},
		// softmax(logits) sorted: 3→.463 2.5→.281 2→.170 ... cumulative .744 < .8 <= .914
		{"top-p 0.8", Options{Temperature: 1, TopP: 0.8}, []int{1, 4, 2}, 1},
		{"top-p 0.4 keeps the top token", Options{Temperature: 1, TopP: 0.4}, []int{1}, 1},
		{"top-p 1 is off", Options{Temperature: 1, TopP: 1}, []int{0, 1, 2, 3, 4, 5}, 1},
		// min-p 0.3: keep p >= 0.3*p(3), i.e. logit >= 3+ln 0.3 = 1.796
		{"min-p 0.3", Options{Temperature: 1, MinP: 0.3}, []int{1, 2, 4}, 1},
		{"top-k then min-p", Options{Temperature: 1, TopK: 3, MinP: 0.5}, []int{1, 4}, 1},
		{"min-p above 1 keeps the top token", Options{Temperature: 1, MinP: 2}, []int{1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := New(tc.opt).Probs(logits, nil)
			ref := softmaxRef(logits, tc.temp)
			var mass float64
			for _, id := range tc.keep {
				mass += ref[id]
			}
			want := make([]float64, len(logits))
			for _, id := range tc.keep {
				want[id] = ref[id] / mass
			}
			for i := range want {
				if !near(float64(got[i]), want[i], 1e-6) {
					t.Fatalf("Probs = %v, want %v", got, want)
				}
			}
		})
	}
}

func TestInfiniteLogits(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		logits []float32
		want   []float32
	}{
		{"all -inf is uniform", []float32{-inf, -inf}, []float32{0.5, 0.5}},
		{"+inf takes all", []float32{1, inf, 2}, []float32{0, 1, 0}},
		{"all NaN is uniform", []float32{float32(math.NaN()), float32(math.NaN())}, []float32{0.5, 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := New(Options{Temperature: 1}).Probs(tc.logits, nil)
			for i := range got {
				if !near(float64(got[i]), float64(tc.want[i]), 1e-7) {
					t.Fatalf("Probs = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestTinyTemperatureNearsGreedy: as T falls toward 0 the draw nears the
// greedy token, down to temperatures whose 1/T overflows float32, where
// scaling the logits themselves took every positive one to +Inf and drew
// among them all. Tokens tied at the top keep sharing the mass.
func TestTinyTemperatureNearsGreedy(t *testing.T) {
	logits := lmLogits(512, 3)
	best := argmax(logits)
	tied := slices.Clone(logits)
	other := (best + 7) % 512
	tied[other] = tied[best]
	for _, temp := range []float32{1e-30, 1e-38, 1e-40, 1e-45} {
		for _, opt := range []Options{{Temperature: temp}, {Temperature: temp, TopP: 0.9}, {Temperature: temp, TopK: 5}, {Temperature: temp, RepeatPenalty: 1.3}} {
			s := New(opt)
			if p := s.Probs(logits, nil); p[best] != 1 {
				t.Errorf("%+v: Probs gives the greedy token %d %g", opt, best, p[best])
			}
			if p := s.Probs(tied, nil); !near(float64(p[best]), 0.5, 1e-6) || !near(float64(p[other]), 0.5, 1e-6) {
				t.Errorf("%+v: two tokens tied at the top get %g and %g", opt, p[best], p[other])
			}
			drawn := map[int32]int{}
			for range 200 {
				drawn[s.Sample(logits, nil)]++
			}
			if drawn[best] != 200 {
				t.Errorf("%+v: 200 draws gave %v, want the greedy token %d every time", opt, drawn, best)
			}
		}
	}
	// An infinite temperature spreads the mass evenly over the finite
	// logits; a −Inf one keeps none (−Inf·0 is NaN).
	withInf := slices.Clone(logits[:8])
	withInf[3] = float32(math.Inf(-1))
	for _, opt := range []Options{{Temperature: float32(math.Inf(1))}, {Temperature: float32(math.Inf(1)), TopP: 0.9}} {
		p := New(opt).Probs(withInf, nil)
		for i, x := range p {
			if want := float32(1.0 / 7); i == 3 && x != 0 || i != 3 && !near(float64(x), float64(want), 1e-6) {
				t.Errorf("%+v: Probs %v, want 1/7 on every finite logit", opt, p)
				break
			}
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := []float32{0.3, 1.2, -0.4, 0.9, 0.0, 1.1, 0.5, -1}
	run := func(seed uint64) []int32 {
		s := New(Options{Temperature: 1, TopK: 6, TopP: 0.95, Seed: seed})
		var out []int32
		for range 200 {
			out = append(out, s.Sample(logits, out))
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 42 gave different tokens at step %d: %d vs %d", i, a[i], b[i])
		}
		same = same && a[i] == c[i]
	}
	if same {
		t.Fatal("seeds 42 and 43 gave identical runs of 200 draws")
	}
}

// TestTemperatureMatchesSoftmax checks the draw frequencies against
// softmax(logits/T) with a chi-square test. The seed is fixed, so the
// statistic is deterministic; the bound is the 0.999 quantile of
// chi-square with 7 degrees of freedom, so a correct sampler passes it for
// all but one seed in a thousand and a biased one fails.
func TestTemperatureMatchesSoftmax(t *testing.T) {
	logits := []float32{0.3, 1.2, -0.4, 0.9, 0.0, 1.1, 0.5, -1}
	const (
		temp  = 0.7
		draws = 40000
		bound = 24.32 // chi-square(7), p = 0.999
	)
	s := New(Options{Temperature: temp, Seed: 7})
	counts := make([]float64, len(logits))
	for range draws {
		counts[s.Sample(logits, nil)]++
	}
	want := softmaxRef(logits, temp)
	var chi2 float64
	for i, p := range want {
		e := p * draws
		chi2 += (counts[i] - e) * (counts[i] - e) / e
	}
	if chi2 > bound {
		t.Fatalf("chi-square %.2f > %.2f: counts %v, expected proportions %v", chi2, bound, counts, want)
	}
	// The same test must reject the untempered distribution, or it would
	// not be able to fail.
	wrong := softmaxRef(logits, 1)
	var chiWrong float64
	for i, p := range wrong {
		e := p * draws
		chiWrong += (counts[i] - e) * (counts[i] - e) / e
	}
	if chiWrong <= bound {
		t.Fatalf("chi-square against T=1 is %.2f, the test cannot tell temperatures apart", chiWrong)
	}
}

func TestDraw(t *testing.T) {
	s := New(Options{Seed: 1})
	if got := s.Draw([]float32{0, 0, -1}); got != -1 {
		t.Fatalf("Draw with no positive weight = %d, want -1", got)
	}
	for range 100 {
		if got := s.Draw([]float32{0, 3, 0, 1}); got != 1 && got != 3 {
			t.Fatalf("Draw picked zero-weight index %d", got)
		}
	}
}

// TestLookingAhead: the winner RaceAhead(p, k) names is the token the
// draw k draws later picks, whatever the draws between take, and looking
// ahead moves nothing: the stream's draws come out as without it.
func TestLookingAhead(t *testing.T) {
	dists := [][]float32{{0.1, 0.2, 0.3, 0.4}, {0.7, 0, 0.3}, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 0.05, 0, 0.9, 0.05}}
	plain, looking := New(Options{Seed: 7}), New(Options{Seed: 7})
	const n = 400
	ahead := make([][]int32, n) // ahead[i]: what draws i, i+1, i+2 were foretold to pick
	for i := range n {
		p := dists[i%len(dists)]
		for k := range 3 {
			if i+k < n {
				ahead[i+k] = append(ahead[i+k], looking.RaceAhead(nil, dists[(i+k)%len(dists)], k, 1)[0])
			}
		}
		got, want := looking.Draw(p), plain.Draw(p)
		if got != want {
			t.Fatalf("draw %d: %d after looking ahead, %d without", i, got, want)
		}
		for k, tok := range ahead[i] {
			if tok != got {
				t.Fatalf("draw %d picked %d; looked at from %d draws before, it was to pick %d", i, got, len(ahead[i])-1-k, tok)
			}
		}
	}
	if got := looking.RaceAhead(nil, []float32{0, -1}, 0, 3); len(got) != 0 {
		t.Errorf("RaceAhead with no positive weight = %v, want none", got)
	}
}

// lmLogits is a vocabulary's logits shaped like a language model's: most
// tokens near zero, a few far above them, so top-p keeps tens of tokens.
func lmLogits(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(r.NormFloat64() * 2)
	}
	for range 20 {
		logits[r.IntN(n)] += 8 + float32(r.Float64()*6)
	}
	return logits
}

// BenchmarkSample draws one token from a 512-token (tok512) and a
// 32000-token (Llama) vocabulary with the options generate and serve
// pass most often.
func BenchmarkSample(b *testing.B) {
	for _, n := range []int{512, 32000} {
		logits := lmLogits(n, 7)
		for _, tc := range []struct {
			name string
			opt  Options
		}{
			{"greedy", Options{}},
			{"temp", Options{Temperature: 0.8}},
			{"top-p", Options{Temperature: 0.8, TopP: 0.95}},
			{"top-k-p", Options{Temperature: 0.8, TopK: 40, TopP: 0.95}},
			{"penalty", Options{Temperature: 0.8, TopP: 0.95, RepeatPenalty: 1.1, RepeatLastN: 64}},
		} {
			b.Run(fmt.Sprintf("vocab=%d/%s", n, tc.name), func(b *testing.B) {
				s := New(tc.opt)
				history := make([]int32, 256)
				for i := range history {
					history[i] = int32(i * 7 % n)
				}
				for b.Loop() {
					s.Sample(logits, history)
				}
			})
		}
	}
}

// TestRaceAhead: RaceAhead lists the race's finishers in order, as sorting
// every token's time does, its first the token that draw picks; and the
// shortcut that skips tokens without a logarithm skips no finisher.
func TestRaceAhead(t *testing.T) {
	s := New(Options{Seed: 3})
	for trial := range 200 {
		p := make([]float32, 1+trial%64)
		for i := range p {
			if (i+trial)%5 != 0 {
				p[i] = float32(math.Exp(float64((i*7+trial)%11) / 2))
			}
		}
		if heaviest(p) < 0 {
			continue
		}
		k := trial % 4
		word := s.ahead(k)
		var order []int32
		for i, x := range p {
			if x > 0 {
				order = append(order, int32(i))
			}
		}
		time := func(i int32) float64 { return -math.Log(unit(word, i)) / float64(p[i]) }
		slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(time(a), time(b)) })
		n := 1 + trial%6
		got := s.RaceAhead([]int32{-7}, p, k, n)
		want := append([]int32{-7}, order[:min(n, len(order))]...)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: RaceAhead(%d, %d) = %v, want %v", trial, k, n, got, want)
		}
		for range k {
			s.Draw(p) // move the stream on to the draw looked at
		}
		if d := s.Draw(p); d != order[0] {
			t.Fatalf("trial %d: Draw = %d, the race's winner is %d", trial, d, order[0])
		}
	}
}

// TestRaceOnLogitsIsTheDraw: without top-k and top-p, Sample races the
// logits' unnormalised weights (raceLogits). It must pick the token Draw
// picks from Probs with the same word, and take one word as Draw does.
// The two may differ only where the winners' times agree to float32
// rounding (Probs rounds each weight once more): such a pair is a tie,
// and the test checks that each difference is one.
func TestRaceOnLogitsIsTheDraw(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	history := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	cases := []struct {
		name   string
		logits []float32
		opt    Options
		hist   []int32
	}{
		{"lm32000", lmLogits(32000, 3), Options{Temperature: 0.8}, nil},
		{"lm32000 hot", lmLogits(32000, 4), Options{Temperature: 1.7}, nil},
		{"lm512 cold", lmLogits(512, 5), Options{Temperature: 0.3}, nil},
		{"lm512 penalty", lmLogits(512, 6), Options{Temperature: 1, RepeatPenalty: 1.3, RepeatLastN: 4}, history},
		{"lm512 min-p", lmLogits(512, 7), Options{Temperature: 1, MinP: 0.02}, nil},
		{"flat", make([]float32, 40), Options{Temperature: 1}, nil},
		{"top-k off and top-p 1", lmLogits(64, 8), Options{Temperature: 1, TopK: 64, TopP: 1}, nil},
		{"-Inf and NaN", []float32{-inf, 0.5, nan, 2, -inf, 1.5, nan}, Options{Temperature: 1}, nil},
		{"+Inf share the mass", []float32{1, inf, nan, inf, 3, -inf}, Options{Temperature: 1}, nil},
		{"nothing finite", []float32{-inf, nan, -inf, -inf}, Options{Temperature: 1}, nil},
		{"the penalty takes the last finite to -Inf", []float32{nan, -2.8736345e38, -inf}, Options{Temperature: 1, MinP: 0.1, RepeatPenalty: 1.2}, []int32{0, 1}},
		{"1/T overflows", []float32{-1, 0.5, 0, 2, -3}, Options{Temperature: 1e-39}, nil},
		{"far tail", []float32{0, -800, -60, -30, -745, -20}, Options{Temperature: 1}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { drawsAgree(t, tc.opt, tc.logits, tc.hist, true) })
	}
}

// TestEmptyLogits: no tokens draw -1 and have an empty distribution, in
// every mode, without a panic (Probs of empty logits read a first token).
func TestEmptyLogits(t *testing.T) {
	for _, opt := range []Options{{}, {Temperature: 1}, {Temperature: 1, TopP: 0.9}, {Temperature: 1, TopK: 3, MinP: 0.1},
		{Temperature: 0.7, RepeatPenalty: 1.2}} {
		if p := New(opt).Probs(nil, []int32{1}); len(p) != 0 {
			t.Errorf("%+v: Probs(nil) = %v, want none", opt, p)
		}
		if got := New(opt).Sample([]float32{}, []int32{1}); got != -1 {
			t.Errorf("%+v: Sample(empty) = %d, want -1", opt, got)
		}
	}
}

// sampleVersusDraw samples logits with opt (not greedy) by Sample, which
// races the logits (raceLogits) or shape's softmax (raceShaped), and by
// Draw on Probs, with the same word. It reports an error when the two
// pick different tokens but for a rounding tie, which it reports: the
// winners' times agree to float32 rounding, or one of them sits on the
// min-p floor, which Probs compares after rounding each probability and
// the race on logits before.
func sampleVersusDraw(opt Options, logits []float32, hist []int32) (tie bool, err error) {
	racing, drawing := New(opt), New(opt)
	word := racing.ahead(0)
	got := racing.Sample(logits, hist)
	p := drawing.Probs(logits, hist)
	want := drawing.Draw(p)
	if a, b := racing.rng.Uint64(), drawing.rng.Uint64(); a != b {
		return false, fmt.Errorf("%+v: the streams part after the draw", opt)
	}
	if got == want {
		return false, nil
	}
	if got < 0 || int(got) >= len(p) || want < 0 {
		return false, fmt.Errorf("%+v: raced %d, Draw picked %d", opt, got, want)
	}
	if opt.MinP > 0 && (onFloor(opt, logits, hist, got) || onFloor(opt, logits, hist, want)) {
		return true, nil
	}
	if !(p[got] > 0) {
		return false, fmt.Errorf("%+v: raced %d, which has probability %v; Draw picked %d", opt, got, p[got], want)
	}
	tg := -math.Log(unit(word, got)) / float64(p[got])
	tw := -math.Log(unit(word, want)) / float64(p[want])
	if math.Abs(tg-tw) > 1e-6*tw {
		return false, fmt.Errorf("%+v: raced %d (time %.9g), Draw picked %d (time %.9g): not a rounding tie", opt, got, tg, want, tw)
	}
	return true, nil
}

// onFloor reports whether token i's weight relative to the likeliest
// token is min-p's floor to float32 rounding.
func onFloor(opt Options, logits []float32, hist []int32, i int32) bool {
	z := append([]float32(nil), logits...)
	New(opt).penalize(z, hist)
	inv := 1 / opt.Temperature
	m := float32(math.Inf(-1))
	for _, v := range z {
		if x := v * inv; x > m { // NaN never is (max would give NaN)
			m = x
		}
	}
	w := math.Exp(float64(z[i]*inv) - float64(m))
	floor := float64(min(opt.MinP, 1))
	return math.Abs(w-floor) <= 1e-5*floor
}

// TestSampleIsTheDrawOnProbs: with top-k or top-p, Sample races shape's
// softmax over the ids kept (raceShaped) instead of cutting, applying
// min-p and renormalising the whole vocabulary. It must pick the token
// Draw picks from Probs with the same word but at a rounding tie
// (sampleVersusDraw), on model-shaped, flat and infinite logits.
func TestSampleIsTheDrawOnProbs(t *testing.T) {
	inf := float32(math.Inf(1))
	history := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	flat := make([]float32, 32000)
	for i := range flat {
		flat[i] = float32(i%7) * 1e-3
	}
	cases := []struct {
		name   string
		logits []float32
		opt    Options
		hist   []int32
	}{
		{"lm32000 top-p", lmLogits(32000, 3), Options{Temperature: 0.8, TopP: 0.95}, nil},
		{"lm32000 top-k top-p", lmLogits(32000, 4), Options{Temperature: 1, TopK: 40, TopP: 0.9}, nil},
		{"lm512 top-k", lmLogits(512, 5), Options{Temperature: 0.7, TopK: 5}, nil},
		{"lm512 top-p min-p penalty", lmLogits(512, 6), Options{Temperature: 1.2, TopP: 0.8, MinP: 0.05, RepeatPenalty: 1.3}, history},
		{"lm512 top-k min-p", lmLogits(512, 7), Options{Temperature: 1, TopK: 50, MinP: 0.2}, nil},
		{"flat top-p", flat, Options{Temperature: 1, TopP: 0.5}, nil},
		{"top-p keeps all", []float32{1, 1, 1, 1}, Options{Temperature: 1, TopP: 0.99}, nil},
		{"top-k of -Inf", []float32{-inf, -inf, -inf, 2}, Options{Temperature: 1, TopK: 2, TopP: 0.9}, nil},
		{"+Inf top-p", []float32{1, inf, 3, inf}, Options{Temperature: 1, TopP: 0.6}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { drawsAgree(t, tc.opt, tc.logits, tc.hist, false) })
	}
}

// drawsAgree runs sampleVersusDraw for seeds 0-299 of opt, whose Sample
// must race the logits (onLogits) or shape's softmax: every draw the same
// but for rounding ties, and those next to none.
func drawsAgree(t *testing.T, opt Options, logits []float32, hist []int32, onLogits bool) {
	t.Helper()
	if got := New(opt).racesLogits(len(logits)); got != onLogits {
		t.Fatalf("%+v: Sample races the logits: %v, want %v", opt, got, onLogits)
	}
	const draws = 300
	ties := 0
	for seed := range uint64(draws) {
		opt.Seed = seed
		tie, err := sampleVersusDraw(opt, logits, hist)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if tie {
			ties++
		}
	}
	if ties > draws/100 {
		t.Errorf("%d of %d draws differ by rounding ties; expected next to none", ties, draws)
	}
}

// TestRankIsTheSortOrder: rank's heap, with its float compare turning
// tokens away, and its radix sort both give the head of the stable sort
// by value, largest first, ±0 alike, for every head length.
func TestRankIsTheSortOrder(t *testing.T) {
	inf := float32(math.Inf(1))
	r := rand.New(rand.NewPCG(9, 9))
	for trial := range 60 {
		n := 1 + r.IntN(700)
		v := make([]float32, n)
		for i := range v {
			switch r.IntN(8) {
			case 0:
				v[i] = float32(math.Copysign(0, float64(r.IntN(2)-1)))
			case 1:
				v[i] = -inf
			case 2:
				v[i] = inf
			case 3:
				v[i] = float32(r.IntN(3)) // ties
			default:
				v[i] = float32(r.NormFloat64())
			}
		}
		want := make([]int32, n)
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(a, b int32) int { return cmp.Compare(v[b]+0, v[a]+0) })
		s := New(Options{})
		for _, m := range []int{0, 1, 2, 63, 64, n/4 - 1, n / 4, n/4 + 1, n - 1, n} {
			if m < 0 || m > n {
				continue
			}
			s.rank(v, m)
			if !slices.Equal(s.idx, want[:m]) {
				t.Fatalf("trial %d: rank(%d of %d) = %v, want %v", trial, m, n, s.idx, want[:m])
			}
		}
	}
	for _, x := range []float32{0, float32(math.Copysign(0, -1)), 1, -1, inf, -inf, math.SmallestNonzeroFloat32, -math.MaxFloat32} {
		want := x + 0 // -0 reads +0
		if got := keyValue(rankKey(x, 7)); got != want || math.Signbit(float64(got)) != math.Signbit(float64(want)) {
			t.Errorf("keyValue(rankKey(%g)) = %g, want %g", x, got, want)
		}
	}
}
