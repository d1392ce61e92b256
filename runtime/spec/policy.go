package spec

import (
	"math"
	"slices"
	"time"
)

// TreeState is what a Trigger sees of the draft's tree.
type TreeState struct {
	Nodes    int     // drafted tokens in the tree (the root not counted)
	Branches int     // branches the draft may still extend
	MaxConf  float64 // T_c = max_i C_i over the open branches (0 when none is open)
	SumConf  float64 // Σ C over the drafted tokens: the draft's own estimate of the tokens a verification accepts
	// ConfByDepth is SumConf split by depth: index d-1 holds depth d.
	ConfByDepth []float64
	// Handover is set when the draft declined to guess further (BiLD's
	// fallback: its top probability fell below the fallback threshold).
	Handover bool
	// The last draft step: the confidence it added (Σ C of its new
	// tokens), how many tokens it added, and how long it took.
	LastGain    float64
	LastByDepth []float64 // LastGain split by depth, as ConfByDepth
	LastAdded   int
	LastStep    time.Duration
	// Draft is the draft time this round has cost so far, outside any
	// verification (pipelined steps are free: the target waits on IO).
	Draft time.Duration
}

// Outcome is what one verification found, for a Trigger to learn from.
type Outcome struct {
	Verified int // drafted tokens the target checked
	Prompt   int // prompt tokens that rode with the pass (the first one)
	// Others are the rows of other sequences' trees verified in the same
	// pass (Group): the pass's cost counts them too.
	Others   int
	Accepted int // drafted tokens accepted
	// Branch is the length of the tree branch that best matched the
	// accepted path (N_all) and Correct how many of its tokens were
	// accepted (N_correct).
	Branch, Correct int
	SumConf         float64       // Σ C over the verified tokens
	ConfByDepth     []float64     // SumConf split by depth (index d-1 for depth d)
	Time            time.Duration // the target pass
	IOWait          time.Duration // of Time, waiting for streamed weights
}

// Trigger decides when the draft's tree goes to the target. The decoder
// also verifies, whatever the trigger says, when the tree reaches its
// size cap or no branch is left to extend.
type Trigger interface {
	// Verify is asked after every draft step.
	Verify(s TreeState) bool
	// Observe is told the outcome of every verification.
	Observe(o Outcome)
}

// Adaptive is LLMCad's self-adaptive fallback: verify when the tree's
// cumulative confidence T_c falls below Alpha, and learn Alpha from each
// verification: when every drafted token of the best-matching branch was
// accepted the draft is trusted more (Alpha halves, so trees grow deeper);
// otherwise Alpha becomes that branch's rejected fraction
// (N_all − N_correct)/N_all, so a draft that keeps missing is verified
// sooner.
type Adaptive struct {
	Alpha float64 // the current threshold; 0 starts at DefaultAlpha
}

// DefaultAlpha is Adaptive's starting threshold.
const DefaultAlpha = 0.01

// minAlpha keeps halving from reaching 0, where only the size cap would
// end a tree.
const minAlpha = 1e-6

func (a *Adaptive) Verify(s TreeState) bool {
	if !(a.Alpha > 0) { // NaN too: no threshold would end a tree
		a.Alpha = DefaultAlpha
	}
	return s.Handover || s.Branches == 0 || s.MaxConf < a.Alpha
}

func (a *Adaptive) Observe(o Outcome) {
	if o.Branch <= 0 {
		return
	}
	if !(a.Alpha > 0) {
		a.Alpha = DefaultAlpha
	}
	if o.Correct >= o.Branch {
		a.Alpha = max(a.Alpha*0.5, minAlpha)
	} else {
		a.Alpha = float64(o.Branch-o.Correct) / float64(o.Branch)
	}
}

// FixedSize verifies when the tree holds N drafted tokens: classic
// speculative decoding's draft length, and the "no adaptive fallback"
// ablation of the tree mode.
type FixedSize struct{ N int }

func (f FixedSize) Verify(s TreeState) bool {
	return s.Handover || s.Branches == 0 || s.Nodes >= f.N
}

func (FixedSize) Observe(Outcome) {}

// CostAware sizes the tree from measured costs, in the spirit of Sequoia:
// it keeps drafting while the last draft step raised the expected tokens
// per second of the round, and verifies when it stopped doing so.
//
// The round's expected tokens are E = 1 + Σ_d k_d·ΣC_d (one token is
// always emitted; C, the draft's confidence in a branch, estimates the
// chance the target accepts it, and k_d calibrates that estimate at depth
// d against what verifications actually accepted there). Calibrating by
// depth matters: C is a product of the draft's probabilities as if its
// guesses were independent, but a draft that guessed the first tokens
// right is in familiar text and guesses on, so the deep nodes are
// accepted several times more often than their C says (stories260K with
// the llama2xs draft: 1.5x at depth 1, 5x and more past depth 6). Its time is T = draft time + t_v(n),
// the verification cost of n drafted tokens. A streamed target computes
// while its weights stream in, so a pass takes the longer of the two:
// t_v(n) = max(io, c0 + b·(n+1)), with io the length of an IO-bound pass
// and the compute c0 + b·(n+1) fitted on the target's last passes (b is
// the slope of compute against tree size). A draft step that added gain g
// of confidence for cost c (its own time plus what its tokens add to
// t_v) is worth it while k·g/c ≥ E/T. So a streamed target, whose pass
// costs the same for 4 tokens or 40 until its compute outgrows the IO,
// gets large trees, and a resident one small trees.
type CostAware struct {
	k float64 // accepted tokens per unit of ΣC (EWMA)
	// acc[d-1], conf[d-1] and passes[d-1] are exponentially weighted
	// sums, over the verifications whose tree reached depth d, of those
	// accepting that deep (0 or 1 each), of ΣC at depth d and of the
	// verifications themselves: k_d is acc/conf, pulled towards k by
	// depthPrior verifications' worth where few were seen.
	acc, conf, passes []float64
	io                float64 // seconds an IO-bound pass takes (EWMA; 0 when none was)
	// The pass's compute, t = c0 + b·(n+1), fitted by least squares over
	// recent passes (exponentially weighted moments of n+1 and t): trees
	// vary in size, so the slope b is what one more token costs, apart
	// from fixed costs (and from waits for the lane while the draft
	// worked, which do not grow with the tree).
	sn, st, snn, snt, sw float64
	seen                 int
	// steps are the last draft steps' times; their median prices a step,
	// so one step slowed by the other model's compute or a page fault
	// does not end the tree.
	steps     [stepWindow]time.Duration
	stepsSeen int
	// Warmup is the tree size used until a pass has been measured
	// (default 8).
	Warmup int
}

const stepWindow = 9

// stepCost records a draft step's time and returns the median of the
// recent ones.
func (c *CostAware) stepCost(d time.Duration) float64 {
	c.steps[c.stepsSeen%stepWindow] = d
	c.stepsSeen++
	recent := c.steps // a copy: the window keeps its order
	n := min(c.stepsSeen, stepWindow)
	slices.Sort(recent[:n])
	return recent[n/2].Seconds()
}

// ewmaWeight weighs a new observation against the running estimates.
const ewmaWeight = 0.3

func ewma(old, v float64, first bool) float64 {
	if first {
		return v
	}
	return (1-ewmaWeight)*old + ewmaWeight*v
}

// perToken is b, the compute one more verified token costs.
func (c *CostAware) perToken() float64 {
	mn, mt := c.sn/c.sw, c.st/c.sw
	varn := c.snn/c.sw - mn*mn
	if varn > 0.25 { // sizes vary enough to tell slope from fixed cost
		return math.Max(0, (c.snt/c.sw-mn*mt)/varn)
	}
	return mt / mn // all compute per token: an upper bound
}

func (c *CostAware) Verify(s TreeState) bool {
	if s.Handover || s.Branches == 0 {
		return true
	}
	if c.seen == 0 {
		w := c.Warmup
		if w <= 0 {
			w = 8
		}
		return s.Nodes >= w
	}
	if s.Nodes == 0 || s.LastAdded == 0 {
		return false
	}
	// While a pass stays IO-bound with more tokens, a drafted token costs
	// only its draft step, and the estimate below undervalues the many
	// low-confidence side branches that a larger tree keeps: draft on
	// while the round's drafting is a small share of the pass.
	if c.io > 0 && c.verifyCost(s.Nodes+max(s.LastAdded, 1)) <= c.io && s.Draft.Seconds() < freeDraftShare*c.io {
		return false
	}
	e, gain := 1+c.k*s.SumConf, c.k*s.LastGain
	if s.ConfByDepth != nil {
		e, gain = 1+c.expected(s.ConfByDepth), c.expected(s.LastByDepth)
	}
	tv := c.verifyCost(s.Nodes)
	t := s.Draft.Seconds() + tv
	cost := c.stepCost(s.LastStep) + tv - c.verifyCost(s.Nodes-s.LastAdded)
	return gain*t < cost*e
}

// freeDraftShare is the share of an IO-bound pass that a round's drafting
// may take before the marginal rule decides alone.
const freeDraftShare = 0.05

// FreeRows is the largest tree whose fitted compute stays within
// fillShare of an IO-bound pass: 0 for a target that does not wait on IO.
func (c *CostAware) FreeRows() int {
	if c.io <= 0 || c.seen == 0 {
		return 0
	}
	b := c.perToken()
	if b <= 0 {
		return math.MaxInt32
	}
	n := (fillShare*c.io-c.st/c.sw)/b + c.sn/c.sw - 1
	return int(math.Max(0, math.Min(math.Floor(n+1e-6), math.MaxInt32))) // 1e-6: the fit's rounding
}

// fillShare is the share of an IO-bound pass its compute may take once a
// tree is filled: compute overlaps the streaming layer by layer, and the
// resident layers and the last layer's compute have no IO to hide
// behind, so a pass whose total compute nears its IO already runs
// longer (tinyllama-1.1b Q4_0, 25% budget, 400 MB/s: 96 tokens cost no
// more than 1, 128 cost 2% more).
const fillShare = 0.7

// depthPrior is the weight of the global k in k_d, in verifications: a
// depth seen in few verifications is calibrated mostly by k.
const depthPrior = 1

// expected is Σ_d k_d·conf[d-1]: the tokens a verification is expected to
// accept of drafted tokens whose Σ C by depth is conf.
func (c *CostAware) expected(conf []float64) float64 {
	var e float64
	for i, x := range conf {
		e += c.DepthFactor(i+1) * x
	}
	return e
}

// DepthFactor is k_d: how many times more often verifications accepted
// a drafted token at depth d than its C said.
func (c *CostAware) DepthFactor(d int) float64 {
	i := d - 1
	if i < 0 || i >= len(c.acc) || c.conf[i] <= 0 {
		return c.k
	}
	n := c.passes[i]
	return (n*c.acc[i]/c.conf[i] + depthPrior*c.k) / (n + depthPrior)
}

// verifyCost is t_v(n): the fitted compute of a pass over n drafted
// tokens, or the IO-bound pass time while that is longer.
func (c *CostAware) verifyCost(n int) float64 {
	compute := c.st/c.sw + c.perToken()*(float64(n+1)-c.sn/c.sw)
	return math.Max(c.io, compute)
}

// ioBound is the share of a pass spent waiting for weights above which
// the pass counts as IO-bound: its length is then the IO's.
const ioBound = 0.05

func (c *CostAware) Observe(o Outcome) {
	first := c.seen == 0
	c.seen++
	if o.SumConf > 0 {
		c.k = ewma(c.k, float64(o.Accepted)/o.SumConf, first)
	} else if first {
		c.k = 1
	}
	for i, x := range o.ConfByDepth {
		if i == len(c.acc) {
			c.acc, c.conf, c.passes = append(c.acc, 0), append(c.conf, 0), append(c.passes, 0)
		}
		hit := 0.0
		if o.Accepted > i {
			hit = 1
		}
		decay := 1 - ewmaWeight
		c.acc[i] = decay*c.acc[i] + hit
		c.conf[i] = decay*c.conf[i] + x
		c.passes[i] = decay*c.passes[i] + 1
	}
	if o.Time > 0 && o.IOWait.Seconds() > ioBound*o.Time.Seconds() {
		c.io = ewma(c.io, o.Time.Seconds(), c.io == 0)
	}
	n := float64(o.Prompt + o.Verified + 1 + o.Others) // the pass's rows
	t := math.Max(0, (o.Time - o.IOWait).Seconds())
	decay := 1 - ewmaWeight
	c.sn, c.st, c.snn, c.snt, c.sw = decay*c.sn+n, decay*c.st+t, decay*c.snn+n*n, decay*c.snt+n*t, decay*c.sw+1
}
