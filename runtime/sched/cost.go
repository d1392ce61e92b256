package sched

import (
	"math"
	"time"
)

// costModel learns a lane's step time as a + b·decoding members + c·
// prefill tokens from the steps it runs: least squares with exponential
// forgetting (recent steps weigh most, so it follows thermal throttling
// and other load) and a weak ridge pull toward a prior. Admission control
// and the priority's η and φ read it.
type costModel struct {
	xtx   [3][3]float64
	xty   [3]float64
	w     float64    // total weight seen
	fit   [3]float64 // a, b, c in seconds
	prior [3]float64 // what the ridge pulls toward
	// tokens per decoding member per step (1 for the plain engine, more
	// for a speculative one), averaged the same way.
	tokPerStep float64
	unsolved   int // observations since the last solve
	// known: the fit comes from observed steps or seeded costs, not the
	// prior alone.
	known bool
}

const (
	costForget = 0.98  // weight kept per new observation: about 50 steps of memory
	costRidge  = 0.05  // prior strength in observations
	costPriorA = 1e-3  // seconds per step
	costPriorB = 1e-3  // seconds per decoding member
	costPriorC = 1e-4  // seconds per prefill token
	costMinB   = 1e-7  // a step never gets free members
	costMaxFit = 3600. // a coefficient beyond an hour is a measuring accident
	// costSolveEvery is how many observations are folded in between two
	// solves once the fit has that many behind it. The memory spans about
	// 50 steps, so the fit lags by a few steps at most, and solving on
	// every step was a tenth of the scheduler's time on a tiny model.
	costSolveEvery = 8
)

func newCostModel() *costModel {
	p := [3]float64{costPriorA, costPriorB, costPriorC}
	return &costModel{fit: p, prior: p, tokPerStep: 1}
}

// seed sets the fit to known costs (the simulator's measured ones, or a
// previous run's) before any observation.
func (m *costModel) seed(a, b, c float64) {
	m.fit = [3]float64{a, b, c}
	m.prior = m.fit
	m.known = true
}

func (m *costModel) observe(sc stepCost, tokens int) {
	if sc.dur <= 0 || (sc.decode == 0 && sc.prefill == 0) {
		return
	}
	x := [3]float64{1, float64(sc.decode), float64(sc.prefill)}
	y := sc.dur.Seconds()
	for i := range 3 {
		for j := range 3 {
			m.xtx[i][j] = costForget*m.xtx[i][j] + x[i]*x[j]
		}
		m.xty[i] = costForget*m.xty[i] + x[i]*y
	}
	m.w = costForget*m.w + 1
	if sc.decode > 0 {
		m.tokPerStep = 0.9*m.tokPerStep + 0.1*float64(tokens)/float64(sc.decode)
	}
	if m.unsolved++; m.unsolved >= costSolveEvery || m.w < costSolveEvery {
		m.unsolved = 0
		m.solve()
	}
}

// solve fits (XᵀX + ρI)β = Xᵀy + ρ·prior, with ρ a small fraction of
// one observation per feature: the prior decides only a coefficient the
// data leaves open (prefill cost before any prefill was seen).
func (m *costModel) solve() {
	prior := m.prior
	var a [3][4]float64
	for i := range 3 {
		rho := costRidge * math.Max(m.xtx[i][i]/math.Max(m.w, 1), 1e-6)
		for j := range 3 {
			a[i][j] = m.xtx[i][j]
		}
		a[i][i] += rho
		a[i][3] = m.xty[i] + rho*prior[i]
	}
	// Gaussian elimination with partial pivoting.
	for c := range 3 {
		p := c
		for r := c + 1; r < 3; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		a[c], a[p] = a[p], a[c]
		if math.Abs(a[c][c]) < 1e-18 {
			return
		}
		for r := range 3 {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for k := c; k < 4; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	var fit [3]float64
	for i := range 3 {
		fit[i] = a[i][3] / a[i][i]
		if !finite(fit[i]) || fit[i] > costMaxFit {
			return
		}
	}
	fit[0] = math.Max(0, fit[0])
	fit[1] = math.Max(costMinB, fit[1])
	fit[2] = math.Max(0, fit[2])
	m.fit = fit
	m.known = true
}

// step predicts the duration of a step with decode decoding members and
// prefill context tokens.
func (m *costModel) step(decode, prefill int) time.Duration {
	s := m.fit[0] + m.fit[1]*float64(decode) + m.fit[2]*float64(prefill)
	return time.Duration(s * float64(time.Second))
}

// perToken is η: the time a member of a batch of n waits per token it
// gets.
func (m *costModel) perToken(n int) time.Duration {
	return time.Duration(float64(m.step(max(n, 1), 0)) / math.Max(m.tokPerStep, 1e-3))
}

// members is the largest batch, from 1 to limit, whose time per token
// (perToken) stays within d.
func (m *costModel) members(d time.Duration, limit int) int {
	// perToken(n) = (a + b·n)/tokPerStep ≤ d  ⇔  n ≤ (d·tokPerStep - a)/b.
	n := (d.Seconds()*math.Max(m.tokPerStep, 1e-3) - m.fit[0]) / m.fit[1]
	return int(math.Max(1, math.Min(float64(limit), math.Floor(n))))
}

// rate is what a batch of n decodes, in tokens per second (0 while the
// step costs nothing measured).
func (m *costModel) rate(n int) float64 {
	step := m.step(max(n, 1), 0)
	if step <= 0 {
		return 0
	}
	return float64(max(n, 1)) * math.Max(m.tokPerStep, 1e-3) / step.Seconds()
}

// prefill is the time to evaluate a context of n tokens in chunks of
// chunk, next to a batch of decode members.
func (m *costModel) prefill(n int) time.Duration {
	return time.Duration(m.fit[2] * float64(n) * float64(time.Second))
}
