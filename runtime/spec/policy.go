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

// roundStart reports whether s is the first question of a round: no
// draft step has run in it yet.
func (s TreeState) roundStart() bool { return s.LastStep == 0 && s.LastAdded == 0 && s.Draft == 0 }

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
	// IORead is the time the target's weights took to read during the
	// pass (0: not known): the IO a pass cannot be shorter than.
	IORead time.Duration
	// Draft is the round's draft time outside the pass (TreeState.Draft
	// when the trigger said verify): 0 for a round that drafted nothing.
	Draft time.Duration
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
	// NoPause drafts every round. By default a decoder alone on its
	// target stops drafting while drafted rounds emit fewer tokens a
	// second than the target would alone (a small resident target, whose
	// pass costs about as much per token as decoding), and probes again
	// after a pause that doubles while drafting keeps not paying and
	// lasts long enough for the probe to cost a tenth of it.
	NoPause bool
	pace    pace
}

// pace is CostAware's record of whether drafting pays.
type pace struct {
	rate   float64 // tokens a second of drafted rounds (EWMA; it survives a pause)
	rounds int     // drafted rounds in rate since it was last reset
	// plain is the tokens a second of paused rounds, with the extra time
	// of the round that then fed the draft their tokens (EWMA over
	// pauses; 0 before the first). pausedTime and pausedTokens add up the
	// current pause.
	plain        float64
	pausedTime   float64
	pausedTokens int
	left         int  // rounds still to run without drafting
	next         int  // the next pause's length in rounds
	catchUp      bool // the next drafted round first feeds the draft the pause's tokens
	grouped      bool // the last pass verified other sequences' trees too
	// probeTime and probeTokens add up the drafted rounds since the last
	// decision: what the probe cost beyond the target alone sizes the
	// pause that follows it.
	probeTime   float64
	probeTokens int
}

const (
	// A pause starts at firstPause rounds and doubles, up to maxPause,
	// each time the probe after it finds drafting still does not pay.
	// It is also long enough that the probe before it, decideAfter
	// drafted rounds, cost at most probeShare of the pause's time beyond
	// what the target alone would have taken for the probe's tokens. A
	// draft that loses by far (llama2xs before stories260K, larger than
	// its target) then pauses at once for long: over 480 tokens it took
	// 16-76 draft steps instead of 56-195, and decoded 1.44 times as
	// fast (README, "Speculative decoding").
	firstPause  = 8
	maxPause    = 256
	decideAfter = 3
	probeShare  = 0.1
	// pauseBelow is how far below the target's own rate drafted rounds
	// must fall to pause: the rates are measured on a noisy host, and
	// drafting's cost outside the two models is not in either. Before the
	// first pause the target's rate is a fit that leaves out what feeding
	// the draft a pause's tokens costs, so the margin is wider
	// (pauseBelowFitted): with 0.9 the embedded pair, whose drafted rounds
	// come within 15% of its target alone, paused to lose 3% on the whole.
	pauseBelow       = 0.9
	pauseBelowFitted = 0.75
)

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
	if s.roundStart() && c.pause() {
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

// pause reports whether the round starting now skips drafting: the
// target decodes the root alone (with what a kept tree holds), and the
// draft catches up on the tokens when drafting resumes.
func (c *CostAware) pause() bool {
	if c.NoPause || c.pace.grouped || c.pace.left == 0 {
		return false
	}
	c.pace.left--
	return true
}

// observePace keeps the rates of drafted and paused rounds and decides,
// every decideAfter drafted rounds after a pause and after every drafted
// round otherwise, whether drafting pays. A pause's rate counts what the
// round that then fed the draft the pause's tokens took beyond a drafted
// round: pausing saves the draft's steps, not its reading of the text.
// Before the first pause, the target alone is priced at one pass over
// the root (verifyCost(0), fitted on the drafted passes). A round with
// prompt rows in its pass is left out.
func (c *CostAware) observePace(o Outcome) {
	p := &c.pace
	p.grouped = o.Others > 0
	if c.NoPause || p.grouped || o.Prompt > 0 {
		return
	}
	round := (o.Draft + o.Time).Seconds()
	if o.Verified == 0 && o.Draft == 0 { // a paused round
		p.pausedTime += round
		p.pausedTokens++
		return
	}
	if p.catchUp {
		// The round costs the pause what it took beyond a drafted
		// round's time for its tokens.
		if p.rate > 0 {
			p.pausedTime += max(0, round-float64(o.Accepted+1)/p.rate)
		}
		if p.pausedTime > 0 {
			p.plain = ewma(p.plain, float64(p.pausedTokens)/p.pausedTime, p.plain == 0)
		}
		p.pausedTime, p.pausedTokens, p.catchUp = 0, 0, false
		return
	}
	if round <= 0 {
		return
	}
	p.rate = ewma(p.rate, float64(o.Accepted+1)/round, p.rounds == 0)
	p.rounds++
	p.probeTime += round
	p.probeTokens += o.Accepted + 1
	if p.rounds < decideAfter {
		return
	}
	plain, below := p.plain, pauseBelow
	if plain == 0 {
		if t := c.verifyCost(0); t > 0 {
			plain, below = 1/t, pauseBelowFitted
		}
	}
	// The probe's cost beyond the target alone, in paused rounds (a
	// paused round makes one token at the plain rate).
	lost := p.probeTime*plain - float64(p.probeTokens)
	p.probeTime, p.probeTokens = 0, 0
	if p.rate < below*plain {
		p.next = min(max(2*p.next, firstPause, int(math.Ceil(lost/probeShare-1e-6))), maxPause) // 1e-6: the fit's rounding
		p.left, p.catchUp, p.rounds = p.next, true, 0
		return
	}
	p.next = 0 // drafting pays: a later pause starts short again
}

func (c *CostAware) Observe(o Outcome) {
	defer c.observePace(o)
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
		// A pass that waited on IO lasts at least its reads. It may last
		// longer in compute: with 128-token trees over 500 tokens of
		// context, a 48 MB target read in 32 ms took 335 ms a pass and
		// still waited 81 ms, and taking the whole pass for its IO let
		// trees grow as if the compute were free (README, "When to
		// verify").
		io := o.Time
		if o.IORead > 0 {
			io = min(io, o.IORead)
		}
		c.io = ewma(c.io, io.Seconds(), c.io == 0)
	}
	n := float64(o.Prompt + o.Verified + 1 + o.Others) // the pass's rows
	t := math.Max(0, (o.Time - o.IOWait).Seconds())
	decay := 1 - ewmaWeight
	c.sn, c.st, c.snn, c.snt, c.sw = decay*c.sn+n, decay*c.st+t, decay*c.snn+n*n, decay*c.snt+n*t, decay*c.sw+1
}
