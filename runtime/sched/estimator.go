package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// Estimator predicts a request's output length in tokens, the
// uncertainty score u. Calibrated, it runs the prompt's Features through
// an MLP trained on the runtime's own generations for the model (tandem
// calibrate); uncalibrated it falls back to the prompt length. It is
// read-only once made, so requests score concurrently.
type Estimator struct {
	mlp    *MLP
	scores []float64 // quantile points of calibration scores, ascending
}

// NewEstimator uses c's MLP; a nil c gives the prompt-length fallback.
func NewEstimator(c *Calibration) *Estimator {
	if c == nil || c.MLP == nil {
		return &Estimator{}
	}
	return &Estimator{mlp: c.MLP, scores: c.Scores}
}

// Calibrated reports whether an MLP is in use.
func (e *Estimator) Calibrated() bool { return e != nil && e.mlp != nil }

// Score returns u for a prompt of promptTokens tokens whose text is text.
func (e *Estimator) Score(text string, promptTokens int) float64 {
	if !e.Calibrated() || text == "" {
		return float64(max(promptTokens, 1))
	}
	f := Extract(text, promptTokens)
	if u := e.mlp.Predict(f[:]); finite(u) {
		return u
	}
	return float64(max(promptTokens, 1))
}

// CalibrationFormat is the format tag of calibration files.
const CalibrationFormat = "tandem-calibration/1"

// Calibration is what tandem calibrate learns for one model, saved as
// JSON next to the model (CalibrationPath).
type Calibration struct {
	Format     string    `json:"format"`
	Model      string    `json:"model"`       // the model file's base name
	ModelBytes int64     `json:"model_bytes"` // its size, to notice a different file
	Created    time.Time `json:"created"`
	Samples    int       `json:"samples"`    // generations it was trained on
	MaxTokens  int       `json:"max_tokens"` // their generation cap
	Features   []string  `json:"features"`
	MLP        *MLP      `json:"mlp"`
	// Scores are the 0, 5, ..., 100th percentiles of the predicted
	// scores of the calibration prompts: the starting point of the
	// online τ quantile and of the normalisation of û.
	Scores     []float64  `json:"scores"`
	Validation Validation `json:"validation"`
}

// Validation measures the estimator on generations it was not trained on.
type Validation struct {
	N           int     `json:"n"`
	MAE         float64 `json:"mae_tokens"`          // mean absolute error of the MLP, tokens
	FallbackMAE float64 `json:"fallback_mae_tokens"` // of the prompt-length fallback
	MeanMAE     float64 `json:"mean_mae_tokens"`     // of always predicting the training mean
	Spearman    float64 `json:"spearman"`            // rank correlation of prediction and truth
}

// CalibrationPath is where the calibration of the model at modelPath lives.
func CalibrationPath(modelPath string) string { return modelPath + ".calib.json" }

// LoadCalibration reads and checks a calibration file.
func LoadCalibration(path string) (*Calibration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseCalibration(data, path)
}

// ParseCalibration checks a calibration's JSON; name (a file, or what
// else holds it) prefixes its errors.
func ParseCalibration(data []byte, name string) (*Calibration, error) {
	var c Calibration
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: not a calibration file: %w", name, err)
	}
	if c.Format != CalibrationFormat {
		return nil, fmt.Errorf("%s: format %q, want %q; rerun tandem calibrate", name, c.Format, CalibrationFormat)
	}
	if c.MLP == nil {
		return nil, fmt.Errorf("%s: no mlp", name)
	}
	if err := c.MLP.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w; rerun tandem calibrate", name, err)
	}
	if c.MLP.Inputs() != NumFeatures {
		return nil, fmt.Errorf("%s: the mlp takes %d inputs, this tandem computes %d features; rerun tandem calibrate", name, c.MLP.Inputs(), NumFeatures)
	}
	// The inputs are read by position: a file that names other features,
	// or these in another order, would feed the mlp the wrong ones.
	if !slices.Equal(c.Features, FeatureNames[:]) {
		return nil, fmt.Errorf("%s: features %q, this tandem computes %q; rerun tandem calibrate", name, c.Features, FeatureNames)
	}
	if len(c.Scores) != numPercentiles {
		return nil, fmt.Errorf("%s: %d scores, want the %d percentiles 0, 5, ..., 100 (Percentiles); rerun tandem calibrate", name, len(c.Scores), numPercentiles)
	}
	for i, s := range c.Scores {
		if !finite(s) || s < 0 || (i > 0 && s < c.Scores[i-1]) {
			return nil, fmt.Errorf("%s: scores must be finite, >= 0 and ascending (entry %d is %v)", name, i, s)
		}
	}
	return &c, nil
}

// Save writes the calibration as indented JSON (via a temporary file, so
// a crash never leaves half a file).
func (c *Calibration) Save(path string) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// numPercentiles is how many Percentiles returns: 0, 5, ..., 100.
const numPercentiles = 21

// Percentiles returns the 0, 5, ..., 100th percentiles of v (for
// Calibration.Scores).
func Percentiles(v []float64) []float64 {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	out := make([]float64, numPercentiles)
	for i := range out {
		out[i] = quantileSorted(s, float64(i)/(numPercentiles-1))
	}
	return out
}

// quantileSorted interpolates the q-quantile of ascending s.
func quantileSorted(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Spearman is the rank correlation of a and b.
func Spearman(a, b []float64) (float64, error) {
	if len(a) != len(b) || len(a) < 2 {
		return 0, errors.New("sched: spearman needs two equal series of at least 2")
	}
	ra, rb := ranks(a), ranks(b)
	ma, sa := meanStd(ra)
	mb, sb := meanStd(rb)
	var c float64
	for i := range ra {
		c += (ra[i] - ma) * (rb[i] - mb)
	}
	return c / float64(len(ra)) / (sa * sb), nil
}

// ranks gives average ranks (ties share the mean of their positions).
func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int {
		switch {
		case v[x] < v[y]:
			return -1
		case v[x] > v[y]:
			return 1
		}
		return 0
	})
	r := make([]float64, len(v))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && v[idx[j+1]] == v[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j) / 2
		}
		i = j + 1
	}
	return r
}

// quantiles tracks recent scores for the online τ quantile and the
// normalisation of û: a window of the last scores, seeded with the
// calibration's percentiles, kept sorted as scores come and go (a binary
// search and a short copy per score, instead of a sort per query).
type quantiles struct {
	win    []float64 // ring of the last scores, oldest at next once full
	next   int
	sorted []float64
}

const quantileWindow = 512

func newQuantiles(seed []float64) *quantiles {
	q := &quantiles{win: make([]float64, 0, quantileWindow), sorted: make([]float64, 0, quantileWindow)}
	for _, s := range seed {
		q.add(s)
	}
	return q
}

func (q *quantiles) add(x float64) {
	if len(q.win) < quantileWindow {
		q.win = append(q.win, x)
	} else {
		old := q.win[q.next]
		q.win[q.next] = x
		q.next = (q.next + 1) % quantileWindow
		q.sorted = removeSorted(q.sorted, old)
	}
	q.sorted = insertSorted(q.sorted, x)
}

// insertSorted and removeSorted keep s sorted as x comes and goes (x is
// in s when removed).
func insertSorted(s []float64, x float64) []float64 {
	i, _ := slices.BinarySearch(s, x)
	return slices.Insert(s, i, x)
}

func removeSorted(s []float64, x float64) []float64 {
	i, _ := slices.BinarySearch(s, x)
	return slices.Delete(s, i, i+1)
}

// at returns the p-quantile of the window, or def when nothing was seen.
func (q *quantiles) at(p, def float64) float64 {
	if len(q.sorted) == 0 {
		return def
	}
	return quantileSorted(q.sorted, p)
}

// workSplit finds the requests a much slower second lane should serve:
// the shortest predicted answers without deadlines, up to a share of all
// the work predicted recently. It keeps a window of the last scores, and
// those of requests without deadlines sorted.
type workSplit struct {
	win  []float64 // ring of the last scores, oldest at next once full
	dl   []bool    // whether win's request had a deadline
	next int
	free []float64 // the scores in win without deadlines, sorted
}

func (w *workSplit) add(score float64, deadline bool) {
	if len(w.win) < quantileWindow {
		w.win, w.dl = append(w.win, score), append(w.dl, deadline)
	} else {
		if !w.dl[w.next] {
			w.free = removeSorted(w.free, w.win[w.next])
		}
		w.win[w.next], w.dl[w.next] = score, deadline
		w.next = (w.next + 1) % quantileWindow
	}
	if !deadline {
		w.free = insertSorted(w.free, score)
	}
}

// below returns the largest score such that requests without deadlines
// scored up to it carry no more than share of the window's predicted work
// (every request's, deadlines included): those are the slow lane's. It
// is -1 (none) when even the smallest carries more.
func (w *workSplit) below(share float64) float64 {
	var total float64
	for _, x := range w.win {
		total += x
	}
	goal, acc, lim := share*total, 0.0, -1.0
	for _, x := range w.free {
		if acc += x; acc > goal {
			break
		}
		lim = x
	}
	return lim
}
