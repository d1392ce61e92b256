package sched

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

func TestFeaturesRankPrompts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		feature   int
		more, les string
	}{
		{"open-ended", 4, "Explain in detail why the sky is blue and describe how light scatters.", "What is the capital of France?"},
		{"vague", 3, "Maybe tell me some stuff about various things, kind of whatever, etc.", "List the three primary colors."},
		{"multi-part", 5, "What is a cat? Why do cats purr? First explain, then list examples, also compare dogs.", "What is a cat?"},
		{"syntactic", 1, "I saw the man record the present at the park.", "The sun rises in the east."},
		{"semantic", 2, "The bat by the bank had a light ring.", "The sun rises in the east."},
		{"structural", 0, "She saw the man with the telescope on the hill near the river and the bridge.", "She smiled."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := Extract(tc.more, 20), Extract(tc.les, 20)
			if !(a[tc.feature] > b[tc.feature]) {
				t.Errorf("%s: %q scores %.3f, %q scores %.3f; want the first higher", FeatureNames[tc.feature], tc.more, a[tc.feature], tc.les, b[tc.feature])
			}
		})
	}
}

func TestFeaturesBounded(t *testing.T) {
	for _, text := range []string{"", "?", strings.Repeat("why explain some ", 500), "1. a\n2. b\n- c", "日本語のテキスト", "\x00\xff"} {
		for _, n := range []int{0, 1, 100, 100000} {
			f := Extract(text, n)
			for i, v := range f {
				if !(v >= 0 && v <= 1) {
					t.Errorf("Extract(%q, %d)[%s] = %v, outside [0,1]", text[:min(len(text), 20)], n, FeatureNames[i], v)
				}
			}
		}
	}
	if f := Extract("", 4096); f[6] != 1 {
		t.Errorf("length feature of %d tokens = %v, want 1", PromptLengthScale, f[6])
	}
}

func FuzzExtract(f *testing.F) {
	f.Add("Explain why, in detail? And then list some things.", 12)
	f.Add("ÉTÉ à Zürich: l'œil, ΣΊΣΥΦΟΣ; 3½ İstanbul\xff\xfe x", 3)
	f.Fuzz(func(t *testing.T, text string, n int) {
		for i, v := range Extract(text, n) {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("feature %d = %v", i, v)
			}
		}
		if got, want := splitWords(text, nil), referenceWords(text); !slices.Equal(got, want) {
			t.Fatalf("splitWords(%q) = %q, want %q", text, got, want)
		}
	})
}

// referenceWords is splitWords' plain form: the lowered text split at
// every rune that is not a letter, a digit or an apostrophe.
func referenceWords(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\''
	})
}

// TestSplitWordsMatchesItsReference: the byte-at-a-time split agrees with
// the rune-at-a-time one on ASCII, on upper case, on letters and digits
// beyond ASCII and on invalid UTF-8.
func TestSplitWordsMatchesItsReference(t *testing.T) {
	for _, text := range []string{
		"", " ", "a", "Explain why, in detail? And then list some things.",
		"don't STOP-me now 42nd... 'quoted' end'", "ÉTÉ à Zürich: l'œil, ΣΊΣΥΦΟΣ; 3½ İstanbul",
		"bad \xff\xfe bytes\xc3", "tabs\tand\nnewlines\r\n", "٣ digits ٤٥ and 漢字 words",
		strings.Repeat("many words here ", 40),
	} {
		if got, want := splitWords(text, nil), referenceWords(text); !slices.Equal(got, want) {
			t.Errorf("splitWords(%q) = %q, want %q", text, got, want)
		}
	}
}

// synthetic samples whose length depends on the features, with noise.
func syntheticSamples(n int, seed uint64) ([][]float64, []float64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var xs [][]float64
	var ys []float64
	for range n {
		x := make([]float64, NumFeatures)
		for i := range x {
			x[i] = rng.Float64()
		}
		y := 10 * math.Exp(3*x[4]+1.5*x[5]-x[1]) * (0.8 + 0.4*rng.Float64())
		xs = append(xs, x)
		ys = append(ys, y)
	}
	return xs, ys
}

func TestMLPLearns(t *testing.T) {
	xs, ys := syntheticSamples(400, 1)
	m, err := TrainMLP(xs, ys, TrainOptions{Seed: 7, Epochs: 800})
	if err != nil {
		t.Fatal(err)
	}
	tx, ty := syntheticSamples(200, 2)
	var mae, base float64
	meanY, _ := meanStd(ys)
	var pred []float64
	for i, x := range tx {
		p := m.Predict(x)
		pred = append(pred, p)
		mae += math.Abs(p - ty[i])
		base += math.Abs(meanY - ty[i])
	}
	mae /= float64(len(tx))
	base /= float64(len(tx))
	if mae > 0.4*base {
		t.Errorf("held-out MAE %.2f tokens; predicting the mean gives %.2f: the MLP learned little", mae, base)
	}
	if rho, _ := Spearman(pred, ty); rho < 0.9 {
		t.Errorf("rank correlation %.3f, want >= 0.9", rho)
	}
	// Training is deterministic for a seed.
	m2, _ := TrainMLP(xs, ys, TrainOptions{Seed: 7, Epochs: 800})
	if m.Predict(tx[0]) != m2.Predict(tx[0]) {
		t.Error("same seed, different model")
	}
}

func TestTrainMLPRejectsBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		xs  [][]float64
		ys  []float64
		opt TrainOptions
	}{
		"empty":        {nil, nil, TrainOptions{}},
		"length":       {[][]float64{{1}}, []float64{1, 2}, TrainOptions{}},
		"ragged":       {[][]float64{{1, 2}, {1}}, []float64{1, 2}, TrainOptions{}},
		"negative":     {[][]float64{{1}}, []float64{-1}, TrainOptions{}},
		"nan":          {[][]float64{{1}}, []float64{math.NaN()}, TrainOptions{}},
		"wide":         {[][]float64{{1}}, []float64{1}, TrainOptions{Hidden: []int{64}}},
		"empty hidden": {[][]float64{{1}}, []float64{1}, TrainOptions{Hidden: []int{0}}},
	} {
		if _, err := TrainMLP(tc.xs, tc.ys, tc.opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCalibrationRoundTrip(t *testing.T) {
	xs, ys := syntheticSamples(200, 3)
	for i := range xs {
		xs[i] = xs[i][:NumFeatures]
	}
	m, err := TrainMLP(xs, ys, TrainOptions{Seed: 1, Epochs: 100})
	if err != nil {
		t.Fatal(err)
	}
	// NaN step size and decay take the defaults (they trained NaN weights).
	if _, err := TrainMLP(xs, ys, TrainOptions{Seed: 1, Epochs: 100, LearnRate: math.NaN(), WeightDecay: math.NaN()}); err != nil {
		t.Errorf("NaN learning rate and decay: %v, want the defaults", err)
	}
	c := &Calibration{Format: CalibrationFormat, Model: "m.gguf", Created: time.Unix(0, 0).UTC(), Samples: 200,
		MLP: m, Scores: Percentiles(ys), Features: FeatureNames[:]}
	path := filepath.Join(t.TempDir(), "m.gguf.calib.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadCalibration(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := back.MLP.Predict(xs[0]), m.Predict(xs[0]); got != want {
		t.Errorf("reloaded model predicts %v, saved one %v", got, want)
	}
	e := NewEstimator(back)
	if !e.Calibrated() || e.Score("Explain everything in detail", 8) < 0 {
		t.Error("estimator from the file is not calibrated")
	}
	if u := NewEstimator(nil).Score("anything", 17); u != 17 {
		t.Errorf("fallback score %v, want the prompt length 17", u)
	}
}

func TestLoadCalibrationRejectsDamage(t *testing.T) {
	xs, ys := syntheticSamples(50, 4)
	m, _ := TrainMLP(xs, ys, TrainOptions{Seed: 1, Epochs: 10})
	good := Calibration{Format: CalibrationFormat, MLP: m, Scores: Percentiles(ys), Features: FeatureNames[:]}
	for name, mutate := range map[string]func(c *Calibration){
		"nothing":    func(c *Calibration) {},
		"format":     func(c *Calibration) { c.Format = "other/1" },
		"no mlp":     func(c *Calibration) { c.MLP = nil },
		"scores":     func(c *Calibration) { c.Scores[3], c.Scores[4] = c.Scores[4]+1, c.Scores[3] },
		"no scores":  func(c *Calibration) { c.Scores = nil },
		"few scores": func(c *Calibration) { c.Scores = c.Scores[:3] },
		"features":   func(c *Calibration) { c.Features = c.Features[:3] },
		"order":      func(c *Calibration) { c.Features[0], c.Features[1] = c.Features[1], c.Features[0] },
		"row width":  func(c *Calibration) { c.MLP.Layers[0].W[0] = c.MLP.Layers[0].W[0][:2] },
		"inputs":     func(c *Calibration) { c.MLP.InMean = c.MLP.InMean[:1] },
		"zero std":   func(c *Calibration) { c.MLP.InStd[0] = 0 },
		"out std":    func(c *Calibration) { c.MLP.OutStd = -1 },
		"bias count": func(c *Calibration) { c.MLP.Layers[1].B = nil },
	} {
		t.Run(name, func(t *testing.T) {
			data, _ := json.Marshal(good)
			var c Calibration
			json.Unmarshal(data, &c)
			mutate(&c)
			path := filepath.Join(t.TempDir(), "c.json")
			data, _ = json.Marshal(c)
			os.WriteFile(path, data, 0o644)
			_, err := LoadCalibration(path)
			if name == "nothing" && err != nil {
				t.Errorf("the undamaged file: %v", err)
			}
			if name != "nothing" && err == nil {
				t.Error("accepted")
			}
		})
	}
	path := filepath.Join(t.TempDir(), "junk.json")
	os.WriteFile(path, []byte("{not json"), 0o644)
	if _, err := LoadCalibration(path); err == nil {
		t.Error("junk accepted")
	}
}

func FuzzParseCalibration(f *testing.F) {
	xs, ys := syntheticSamples(20, 5)
	m, _ := TrainMLP(xs, ys, TrainOptions{Seed: 1, Epochs: 5})
	data, _ := json.Marshal(Calibration{Format: CalibrationFormat, MLP: m, Scores: []float64{1, 2}})
	f.Add(data)
	f.Add([]byte(`{"format":"tandem-calibration/1","mlp":{"layers":[{"w":[[1]],"b":[0]}],"in_mean":[0],"in_std":[1],"out_mean":0,"out_std":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCalibration(data, "fuzz")
		if err != nil {
			return
		}
		// A calibration that parses must predict without panicking.
		v := NewEstimator(c).Score("why and how, in detail?", 10)
		if math.IsNaN(v) || v < 0 {
			t.Fatalf("score %v", v)
		}
	})
}

func TestSegmenters(t *testing.T) {
	line, _ := NewSegmenter("line")
	stmt, _ := NewSegmenter("statement")
	re, err := NewRegexSegmenter(`;\s*`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		seg  *Segmenter
		text string
		want int
	}{
		{line, "go left", -1},
		{line, "go left\nthen", 8},
		{line, "\n\n  \ngo\n", 8},
		{line, "\n\n", -1},
		{stmt, "Move 3.5 m", -1},
		{stmt, "Move 3.5 m. Then", 11},
		{stmt, "Stop!\n", 5},
		{stmt, "Done.", -1}, // a sentence counts once the next character shows it ended
		// Closing quotes and brackets belong to the sentence they close.
		{stmt, `Mom said, "Let's go to the park." Lily`, 33},
		{stmt, "(Then stop.) Go", 12},
		{stmt, "He said “Hi.” Then", 17},
		{stmt, `"Done."`, -1},
		{stmt, `Wait." `, 6},
		{re, "a = 1; b", 7},
		{re, "a = 1", -1},
	} {
		if got := tc.seg.Cut(tc.text); got != tc.want {
			t.Errorf("%v.Cut(%q) = %d, want %d", tc.seg, tc.text, got, tc.want)
		}
	}
	for _, bad := range []string{"(", "a*", `\b`} {
		if _, err := NewRegexSegmenter(bad); err == nil {
			t.Errorf("regex %q accepted", bad)
		}
	}
	if _, err := NewSegmenter("paragraph"); err == nil {
		t.Error("unknown delimiter accepted")
	}
}

func TestHoldback(t *testing.T) {
	stops := []string{"User:", "###"}
	for _, tc := range []struct {
		text string
		want int
	}{
		{"hello Us", 2}, {"hello User", 4}, {"hello", 0}, {"a #", 1}, {"a ##", 2}, {"", 0},
	} {
		if got := holdback(tc.text, stops); got != tc.want {
			t.Errorf("holdback(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
	if got := firstStop("ab### User: x", stops); got != 2 {
		t.Errorf("firstStop = %d, want 2", got)
	}
}

func TestCostModelLearnsStepTimes(t *testing.T) {
	m := newCostModel()
	rng := rand.New(rand.NewPCG(1, 2))
	a, b, c := 2e-3, 0.5e-3, 20e-6
	// The first steps are solved at once: the prior (1 ms per member)
	// must not stand while the first batches are planned.
	m.observe(stepCost{decode: 4, dur: time.Duration((a + 4*b) * 1e9)}, 4)
	if got, want := m.step(4, 0).Seconds(), a+4*b; math.Abs(got-want)/want > 0.2 {
		t.Errorf("after one step, step(4, 0) = %.3gs, want about %.3gs", got, want)
	}
	for range 400 {
		n := 1 + rng.IntN(8)
		p := 0
		if rng.IntN(4) == 0 {
			p = rng.IntN(64)
		}
		d := (a + b*float64(n) + c*float64(p)) * (0.95 + 0.1*rng.Float64())
		m.observe(stepCost{decode: n, prefill: p, dur: time.Duration(d * 1e9)}, n)
	}
	for _, tc := range []struct{ n, p int }{{1, 0}, {8, 0}, {4, 64}} {
		want := a + b*float64(tc.n) + c*float64(tc.p)
		got := m.step(tc.n, tc.p).Seconds()
		if math.Abs(got-want)/want > 0.1 {
			t.Errorf("step(%d, %d) = %.3gs, want %.3gs", tc.n, tc.p, got, want)
		}
	}
	if m.tokPerStep < 0.99 || m.tokPerStep > 1.01 {
		t.Errorf("tokens per step %v, want 1", m.tokPerStep)
	}
	// A slowdown (thermal throttling) is followed within the memory.
	for range 100 {
		n := 1 + rng.IntN(8)
		m.observe(stepCost{decode: n, dur: time.Duration(2 * (a + b*float64(n)) * 1e9)}, n)
	}
	if got, want := m.step(8, 0).Seconds(), 2*(a+8*b); math.Abs(got-want)/want > 0.1 {
		t.Errorf("after a slowdown, step(8, 0) = %.3gs, want %.3gs", got, want)
	}
}

func TestQuantilesWindow(t *testing.T) {
	q := newQuantiles(nil)
	if got := q.at(0.9, 42); got != 42 {
		t.Errorf("empty quantile %v, want the default", got)
	}
	for i := range 2 * quantileWindow {
		q.add(float64(i))
	}
	// Only the last window counts: 512..1023.
	if got := q.at(0, 0); got != quantileWindow {
		t.Errorf("minimum %v, want %d", got, quantileWindow)
	}
	if got := q.at(0.5, 0); math.Abs(got-767.5) > 1e-9 {
		t.Errorf("median %v, want 767.5", got)
	}
}

// TestFeaturesPinned pins the feature values a calibration was trained
// on: a change to the word lists or the counting changes what every saved
// calibration means, so it must be deliberate (and recalibrate).
func TestFeaturesPinned(t *testing.T) {
	for _, tc := range []struct {
		text   string
		tokens int
		want   Features
	}{
		{"1. first\n2) second\n- third\n* fourth?? why? how many", 3,
			Features{0, 0, 0, 0.4807692307692308, 0.3333333333333333, 0.75, 0.1666617754563214}},
		{"Kind of, sort of... a lot; and so on. More or less!", 4,
			Features{0.2222222222222222, 0.3571428571428571, 0.3571428571428571, 0.8293838862559242, 0, 0, 0.19348832938792088}},
		{"IS it TRUE or false? Tell me about the bank, in detail, step by step.", 5,
			Features{0.4, 0.47058823529411764, 0.4, 0.35714285714285715, 0.6470588235294118, 0, 0.21540721992910022}},
		{"naïve café — “quoted” it's won't O'Brien", 6, Features{0, 0, 0, 0, 0, 0, 0.23393937782308158}},
	} {
		if got := Extract(tc.text, tc.tokens); got != tc.want {
			t.Errorf("Extract(%q) =\n%v, want\n%v", tc.text, got, tc.want)
		}
	}
}

// TestWorkSplitBelow works the slow lane's share through by hand, and
// checks that scores leaving the window leave the split.
func TestWorkSplitBelow(t *testing.T) {
	var w workSplit
	if got := w.below(0.5); got != -1 {
		t.Errorf("empty window: below = %v, want -1", got)
	}
	for _, x := range []float64{4, 1, 3, 2} {
		w.add(x, false)
	}
	w.add(10, true) // counts in the work, never in the slow lane's part
	// Total 20; the free scores 1, 2, 3, 4 add up to 1, 3, 6, 10.
	for _, c := range []struct{ share, want float64 }{
		{0.04, -1}, {0.05, 1}, {0.25, 2}, {0.3, 3}, {0.5, 4}, {0.9, 4},
	} {
		if got := w.below(c.share); got != c.want {
			t.Errorf("share %v: below = %v, want %v", c.share, got, c.want)
		}
	}
	// A window's worth of 100s pushes every earlier score out.
	for range quantileWindow {
		w.add(100, false)
	}
	// Only 100s are left, in the work and among the free scores: one of
	// them is exactly 1/quantileWindow of it, and any less share is none.
	if got, want := w.below(0.5), 100.0; got != want || len(w.free) != quantileWindow {
		t.Errorf("after the window turned over: below = %v (want %v), %d free scores", got, want, len(w.free))
	}
	if one, none := w.below(1.0/quantileWindow), w.below(0.999/quantileWindow); one != 100 || none != -1 {
		t.Errorf("after the window turned over: below(1/%d) = %v, want 100; just under it %v, want -1", quantileWindow, one, none)
	}
}
