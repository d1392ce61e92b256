package spec

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/runtime/sample"
)

// handTree builds a tree from (parent, token, prob) triples; node 0 is
// the root (token 0). Nodes with children count as expanded.
func handTree(nodes [][3]float64) *tree {
	t := newTree(0)
	for _, n := range nodes {
		t.add(int(n[0]), int32(n[1]), float32(n[2]))
	}
	for i := range t.nodes {
		t.nodes[i].expanded = len(t.nodes[i].children) > 0
	}
	return t
}

// TestPacerMaxMin checks each pacer's pick against the max-min rule
// worked by hand. Open branches (leaves) after the tree below:
//
//	root ─ a(0.6) ─ a1(1.0)       C = 0.6,  T = 2
//	     ├ b(0.3)                 C = 0.3,  T = 1
//	     └ c(0.1)                 C = 0.1,  T = 1
//
// With budget M = 10 the fair shares are 6, 3 and 1, so the deficits
// share − T are 4, 2 and 0: FairPacer extends a1, then b. Uniform shares
// are 10/3 each: deficits 1.33, 2.33, 2.33, so UniformPacer extends b
// (tied with c, more confident). ChainPacer extends the deepest, a1.
// With M = 2 the fair deficits are −0.8, −0.4, −0.8: b goes first.
func TestPacerMaxMin(t *testing.T) {
	tr := handTree([][3]float64{{0, 1, 0.6}, {0, 2, 0.3}, {0, 3, 0.1}, {1, 4, 1.0}})
	leaves := tr.leaves(nil)
	if !slices.Equal(leaves, []int{2, 3, 4}) {
		t.Fatalf("leaves %v, want [2 3 4]", leaves)
	}
	for _, tc := range []struct {
		name   string
		p      Pacer
		budget int
		want   []int
	}{
		{"fair M=10", FairPacer{}, 10, []int{4, 2, 3}},
		{"fair M=2", FairPacer{}, 2, []int{2, 4, 3}},
		{"uniform", UniformPacer{}, 10, []int{2, 3, 4}},
		{"chain", ChainPacer{}, 10, []int{4, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.p.Pick(nil, tr, leaves, tc.budget, 3)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Pick = %v, want %v", got, tc.want)
			}
			if one := tc.p.Pick(nil, tr, leaves, tc.budget, 1); !slices.Equal(one, tc.want[:1]) {
				t.Errorf("Pick(n=1) = %v, want %v", one, tc.want[:1])
			}
		})
	}
}

func TestTreeBookkeeping(t *testing.T) {
	tr := handTree([][3]float64{{0, 1, 0.5}, {0, 2, 0.4}, {1, 3, 0.5}, {3, 4, 0.5}, {1, 5, 0.2}})
	if got := tr.path(4); !slices.Equal(got, []int{0, 1, 3, 4}) {
		t.Errorf("path(4) = %v", got)
	}
	if c := tr.nodes[4].conf; math.Abs(c-0.125) > 1e-6 {
		t.Errorf("C of node 4 = %v, want 0.125", c)
	}
	byDepth := tr.confByDepth(nil)
	for i, want := range []float64{0.5 + 0.4, 0.25 + 0.1, 0.125} {
		if i >= len(byDepth) || math.Abs(byDepth[i]-want) > 1e-6 {
			t.Errorf("Σ C by depth = %v, want %v at depth %d", byDepth, want, i+1)
		}
	}
	if len(byDepth) != 3 {
		t.Errorf("Σ C by depth = %v: %d depths, want 3", byDepth, len(byDepth))
	}
	if got, want := sum(byDepth), 0.5+0.4+0.25+0.125+0.1; math.Abs(got-want) > 1e-6 {
		t.Errorf("Σ C = %v, want %v", got, want)
	}
	if got := tr.maxLeafConf(); math.Abs(got-0.4) > 1e-6 {
		t.Errorf("T_c = %v, want 0.4 (leaf 2)", got)
	}
	// Re-rooting at node 1 keeps its subtree with confidences relative to
	// it and draft rows renumbered.
	for i := range tr.nodes {
		tr.nodes[i].row = i
	}
	remap := []int{-1, 0, -1, 1, 2, 3}
	nt := tr.reroot(1, remap)
	if len(nt.nodes) != 4 || nt.nodes[0].tok != 1 || nt.nodes[0].conf != 1 || nt.nodes[0].row != 0 {
		t.Fatalf("rerooted root %+v (%d nodes)", nt.nodes[0], len(nt.nodes))
	}
	toks := []int32{}
	for _, n := range nt.nodes {
		toks = append(toks, n.tok)
	}
	if !slices.Equal(toks, []int32{1, 3, 4, 5}) {
		t.Errorf("rerooted tokens %v, want [1 3 4 5]", toks)
	}
	if n := nt.nodes[2]; n.depth != 2 || math.Abs(n.conf-0.25) > 1e-6 || n.row != 2 || n.parent != 1 {
		t.Errorf("rerooted node for token 4: %+v", n)
	}
}

func TestAdaptiveTrigger(t *testing.T) {
	a := &Adaptive{}
	if a.Verify(TreeState{Nodes: 3, Branches: 2, MaxConf: 0.02}) {
		t.Error("verified with T_c 0.02 above the default alpha 0.01")
	}
	if !a.Verify(TreeState{Nodes: 3, Branches: 2, MaxConf: 0.005}) {
		t.Error("did not verify with T_c below alpha")
	}
	if !a.Verify(TreeState{Nodes: 3, Branches: 0, MaxConf: 0.5}) {
		t.Error("did not verify with no branch open")
	}
	a.Observe(Outcome{Branch: 4, Correct: 4}) // all accepted: trust the draft more
	if a.Alpha != 0.005 {
		t.Errorf("alpha after a fully accepted branch = %v, want 0.005", a.Alpha)
	}
	a.Observe(Outcome{Branch: 4, Correct: 1}) // 3 of 4 rejected
	if a.Alpha != 0.75 {
		t.Errorf("alpha after 1 of 4 accepted = %v, want 0.75", a.Alpha)
	}
	// A NaN threshold starts at the default, as 0 does: below NaN no
	// confidence falls, so only the size cap ended a tree.
	nan := &Adaptive{Alpha: math.NaN()}
	if !nan.Verify(TreeState{Nodes: 3, Branches: 2, MaxConf: 0.005}) || nan.Alpha != DefaultAlpha {
		t.Errorf("a NaN alpha did not verify below the default threshold (alpha now %v)", nan.Alpha)
	}
	f := FixedSize{N: 4}
	if f.Verify(TreeState{Nodes: 3, Branches: 1}) || !f.Verify(TreeState{Nodes: 4, Branches: 1}) {
		t.Error("FixedSize{4} does not verify at exactly 4 nodes")
	}
}

// TestCostAwareTrigger: a pass that is mostly IO (flat in the tree size)
// keeps the draft going where a compute-bound pass stops it.
func TestCostAwareTrigger(t *testing.T) {
	step := TreeState{Nodes: 10, Branches: 4, SumConf: 3, LastGain: 0.2, LastAdded: 2, LastStep: time.Millisecond, Draft: 10 * time.Millisecond}
	io := &CostAware{}
	io.Observe(Outcome{Verified: 10, Accepted: 3, SumConf: 3, Time: time.Second, IOWait: 950 * time.Millisecond})
	if io.Verify(step) {
		t.Error("IO-bound target: verified although another step costs little of a 1 s pass")
	}
	compute := &CostAware{}
	compute.Observe(Outcome{Verified: 10, Accepted: 3, SumConf: 3, Time: 11 * time.Millisecond})
	if !compute.Verify(step) {
		t.Error("compute-bound target: kept drafting although each token costs as much as the pass gains")
	}
	// A streamed pass computes while its weights stream in: more tokens
	// cost nothing until the compute outgrows the IO. Passes of 1 s with
	// compute growing 10 ms per token: the compute reaches the IO at
	// about 100 tokens.
	overlap := overlapped(10 * time.Millisecond)
	small := TreeState{Nodes: 60, Branches: 4, SumConf: 4, LastGain: 0.02, LastAdded: 2, LastStep: time.Millisecond, Draft: 10 * time.Millisecond}
	if overlap.Verify(small) {
		t.Error("IO-bound target, 60 tokens: verified although their compute hides under the IO")
	}
	big := small
	big.Nodes = 150
	if !overlap.Verify(big) {
		t.Error("IO-bound target, 150 tokens: kept drafting although their compute outgrew the IO (20 ms per step for 0.02 of confidence)")
	}
	// One draft step slowed (the target's compute held the cores, a page
	// fault) prices the next steps no higher: the median of recent steps
	// does.
	steady := &CostAware{}
	steady.Observe(Outcome{Verified: 10, Accepted: 4, SumConf: 4, Time: time.Second, IOWait: 900 * time.Millisecond})
	cheap := TreeState{Nodes: 20, Branches: 4, SumConf: 4, LastGain: 0.005, LastAdded: 2, LastStep: 200 * time.Microsecond}
	for i := range 5 {
		cheap.Nodes += 2
		if steady.Verify(cheap) {
			t.Fatalf("step %d of 0.2 ms adding 0.005 of confidence to a 1 s pass: verified", i)
		}
	}
	slow := cheap
	slow.Nodes += 2
	slow.LastStep = 20 * time.Millisecond
	if steady.Verify(slow) {
		t.Error("one 20 ms draft step among 0.2 ms ones ended the tree")
	}
	fresh := &CostAware{}
	if fresh.Verify(TreeState{Nodes: 7, Branches: 1}) || !fresh.Verify(TreeState{Nodes: 8, Branches: 1}) {
		t.Error("before any pass, CostAware should verify at its warm-up size 8")
	}
}

// TestCostAwareByDepth: the draft's confidence is calibrated per depth, so
// a step adding a little confidence deep in the tree, where verifications
// accept far more often than C says, is worth drafting, and the same
// confidence near the root, where C is about right, is not.
func TestCostAwareByDepth(t *testing.T) {
	c := &CostAware{}
	// Every pass accepts three deep; C says 0.9, 0.2 and 0.01.
	for range 20 {
		c.Observe(Outcome{Verified: 30, Accepted: 3, SumConf: 1.11, ConfByDepth: []float64{0.9, 0.2, 0.01},
			Time: time.Second, IOWait: 950 * time.Millisecond})
	}
	// 60 ms of drafting: past the share of an IO-bound pass that is
	// drafted freely, so the marginal rule decides.
	st := TreeState{Nodes: 30, Branches: 8, SumConf: 1.11, ConfByDepth: []float64{0.9, 0.2, 0.01},
		LastGain: 0.001, LastAdded: 2, LastStep: time.Millisecond, Draft: 60 * time.Millisecond}
	shallow, deep := st, st
	shallow.LastByDepth = []float64{0.001, 0, 0}
	deep.LastByDepth = []float64{0, 0, 0.001}
	if !c.Verify(shallow) {
		t.Error("0.001 of confidence at depth 1 (accepted as often as C says) kept the draft going for 1 ms a step")
	}
	if c.Verify(deep) {
		t.Error("0.001 of confidence at depth 3 (accepted 100 times more often than C says) ended the tree")
	}
	if e := c.expected([]float64{0.9, 0.2, 0.01}); e < 2.5 || e > 3.5 {
		t.Errorf("expected tokens of the observed tree = %.2f, want about the 3 every pass accepted", e)
	}
}

// TestCostAwareDraftsFreelyWhileIOBound: while a pass stays IO-bound with
// more tokens, the tree grows whatever the marginal rule says until the
// round's drafting takes freeDraftShare of a pass; then, or when the pass
// would turn compute-bound, the marginal rule decides again.
func TestCostAwareDraftsFreelyWhileIOBound(t *testing.T) {
	c := &CostAware{}
	for range 5 { // 1 s passes, all but 20 ms of them waiting on IO
		c.Observe(Outcome{Verified: 40, Accepted: 3, SumConf: 3, Time: time.Second, IOWait: 980 * time.Millisecond})
	}
	worthless := TreeState{Nodes: 60, Branches: 4, SumConf: 3, LastGain: 1e-9, LastAdded: 2, LastStep: time.Millisecond}
	early := worthless
	early.Draft = 40 * time.Millisecond
	if c.Verify(early) {
		t.Error("IO-bound pass, 40 ms of drafting per 1 s pass: verified, but drafting is free until 50 ms")
	}
	late := worthless
	late.Draft = 60 * time.Millisecond
	if !c.Verify(late) {
		t.Error("60 ms of drafting per 1 s pass, a step adding nothing: kept drafting")
	}
	// Compute grows 20 ms per token: past 50 tokens it outgrows the IO.
	heavy := overlapped(20 * time.Millisecond)
	if !heavy.Verify(early) {
		t.Error("a pass that 60 more tokens would make compute-bound: drafted on as if free")
	}
	resident := &CostAware{}
	resident.Observe(Outcome{Verified: 40, Accepted: 3, SumConf: 3, Time: 20 * time.Millisecond})
	if !resident.Verify(early) {
		t.Error("resident target (no IO): drafted a step adding nothing")
	}
	// A pass that waited on IO but spent most of its time computing
	// (700 ms over 61 rows): its reads took 100 ms of its 1 s, so it is
	// compute-bound, and a step adding nothing is not free. Without the
	// reads' time the whole pass counts as its IO, as before.
	computeBound := func(read time.Duration) *CostAware {
		c := &CostAware{}
		for range 5 {
			c.Observe(Outcome{Verified: 60, Accepted: 3, SumConf: 3, Time: time.Second, IOWait: 300 * time.Millisecond, IORead: read})
		}
		return c
	}
	if c := computeBound(100 * time.Millisecond); !c.Verify(early) {
		t.Error("a compute-bound pass whose reads took 100 ms: drafted on as if free")
	}
	if c := computeBound(0); c.Verify(early) {
		t.Error("reads' time unknown: the pass no longer counted as IO-bound")
	}
}

// TestCostAwareFreeRows: a streamed target offers the rows whose fitted
// compute stays within fillShare of its IO-bound pass; a resident one, or
// one not measured yet, offers none.
func TestCostAwareFreeRows(t *testing.T) {
	for _, tc := range []struct {
		perToken time.Duration
		want     int
	}{
		{10 * time.Millisecond, 69}, // 0.7 s of compute ÷ 10 ms, less the root
		{2 * time.Millisecond, 349},
	} {
		if got := overlapped(tc.perToken).FreeRows(); got != tc.want {
			t.Errorf("passes of 1 s, compute %v a token: %d free rows, want %d", tc.perToken, got, tc.want)
		}
	}
	resident := &CostAware{}
	resident.Observe(Outcome{Verified: 40, Accepted: 3, SumConf: 3, Time: 20 * time.Millisecond})
	if n := resident.FreeRows(); n != 0 {
		t.Errorf("resident target: %d free rows, want 0", n)
	}
	if n := (&CostAware{}).FreeRows(); n != 0 {
		t.Errorf("no pass measured: %d free rows, want 0", n)
	}
}

// TestCostAwareChargesPromptRows: the prompt tokens that ride with the
// first verification are rows of its pass, so its compute is not taken
// for the cost of the tree alone.
func TestCostAwareChargesPromptRows(t *testing.T) {
	c := &CostAware{}
	for range 2 { // a resident target: 1 ms a row, 8 tree rows, 0 or 8 prompt rows
		c.Observe(Outcome{Verified: 7, Accepted: 3, SumConf: 3, Time: 8 * time.Millisecond})
		c.Observe(Outcome{Verified: 7, Prompt: 8, Accepted: 3, SumConf: 3, Time: 16 * time.Millisecond})
	}
	if got := c.verifyCost(7); math.Abs(got-0.008) > 1e-6 {
		t.Errorf("a pass over 7 drafted tokens costs %.2f ms by the fit, want 8", got*1e3)
	}
}

// overlapped is a CostAware that saw 1 s streamed passes of 11 and 31
// tokens whose compute, perToken a token, hides under the IO.
func overlapped(perToken time.Duration) *CostAware {
	c := &CostAware{}
	for _, n := range []int{10, 30, 10, 30} {
		compute := time.Duration(n+1) * perToken
		c.Observe(Outcome{Verified: n, Accepted: 3, SumConf: 3, Time: time.Second, IOWait: time.Second - compute})
	}
	return c
}

// walkDecoder is a decoder holding only what walk needs.
func walkDecoder(tr *tree, s *sample.Sampler) *Decoder {
	return &Decoder{cfg: Config{}.withDefaults(), tree: tr, sampler: s, history: []int32{0}}
}

// logitsFor returns rows (indexed by node) whose argmax is the token given.
func logitsFor(vocab int, argmax map[int]int32) func(slot int) []float32 {
	return func(slot int) []float32 {
		row := make([]float32, vocab)
		row[argmax[slot]] = 5
		return row
	}
}

// TestWalkGreedy: verification follows the target's greedy choices down
// the longest verified path, and reports the token after it and its node.
func TestWalkGreedy(t *testing.T) {
	//	root ─ 1:a(3) ─ 3:c(2)
	//	     └ 2:b(5) ─ 4:d(7) ─ 5:e(1)   (5 drafted after the snapshot)
	//	     └ 6:x(6) pruned
	tr := handTree([][3]float64{{0, 3, 0.5}, {0, 5, 0.4}, {1, 2, 0.9}, {2, 7, 0.8}, {4, 1, 0.9}, {0, 6, 0.0001}})
	tr.nodes[6].pruned = true
	snap := snapshot{slot: []int{0, 1, 2, 3, 4}} // node i in slot i; 5 and 6 unseen
	for _, tc := range []struct {
		name     string
		argmax   map[int]int32 // per slot
		path     []int
		next     int32
		nextNode int
	}{
		{"deepest branch", map[int]int32{0: 5, 2: 7, 4: 1}, []int{0, 2, 4}, 1, 5},
		{"off the tree at d", map[int]int32{0: 5, 2: 7, 4: 4}, []int{0, 2, 4}, 4, -1},
		{"first branch", map[int]int32{0: 3, 1: 2, 3: 6}, []int{0, 1, 3}, 6, -1},
		{"rejected at the root", map[int]int32{0: 4}, []int{0}, 4, -1},
		{"the pruned guess", map[int]int32{0: 6}, []int{0}, 6, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := walkDecoder(tr, sample.New(sample.Options{}))
			path, next, nextNode := d.walk(snap, logitsFor(8, tc.argmax))
			if !slices.Equal(path, tc.path) || next != tc.next || nextNode != tc.nextNode {
				t.Errorf("walk = %v, next %d (node %d); want %v, next %d (node %d)", path, next, nextNode, tc.path, tc.next, tc.nextNode)
			}
		})
	}
}

// chiSquare returns Pearson's statistic of counts against probabilities
// p over n draws, merging bins expected below 5 into one.
func chiSquare(counts []int, p []float64, n int) (stat float64, df int) {
	var restObs, restExp float64
	for i, c := range counts {
		e := p[i] * float64(n)
		if e < 5 {
			restObs += float64(c)
			restExp += e
			continue
		}
		stat += (float64(c) - e) * (float64(c) - e) / e
		df++
	}
	if restExp > 0 {
		stat += (restObs - restExp) * (restObs - restExp) / restExp
		df++
	}
	return stat, df - 1
}

// chiSquareLimit is a critical value of the chi-square distribution with
// df degrees of freedom at a false-alarm rate near 1e-6 (Wilson–Hilferty),
// so a correct implementation essentially never fails with a fixed seed,
// and a biased one fails by far.
func chiSquareLimit(df int) float64 {
	const z = 4.75 // one-sided normal quantile for 1e-6
	k := float64(df)
	return k * math.Pow(1-2/(9*k)+z*math.Sqrt(2/(9*k)), 3)
}

// TestSampledWalkIsTheTargetsDraw: with temperature, the token a node's
// verification emits is the target's own draw, the one the target alone
// makes with the same seed, whatever the children were; and children
// raced with the target's word (RaceAhead) hold it about as often as
// any draft can without knowing p: at least (1−d)/(1+d) of the time, d
// the two distributions' total variation distance. Children the draft
// proposed from a stream of its own would hold it far less often. A
// chi-square test over the trials holds the output to p.
func TestSampledWalkIsTheTargetsDraw(t *testing.T) {
	p := []float64{0.30, 0.25, 0.15, 0.10, 0.08, 0.06, 0.04, 0.02}
	for _, tc := range []struct {
		name     string
		q        []float64
		children int
	}{
		{"close draft, 1 child", []float64{0.28, 0.27, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02}, 1},
		{"close draft, 3 children", []float64{0.28, 0.27, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02}, 3},
		{"overconfident draft, 4 children", []float64{0.05, 0.8, 0.05, 0.04, 0.03, 0.01, 0.01, 0.01}, 4},
		{"disjoint draft, 2 children", []float64{0, 0, 0, 0, 0, 0.2, 0.3, 0.5}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const trials = 20_000
			logits := make([]float32, len(p))
			for i, v := range p {
				logits[i] = float32(math.Log(v))
			}
			q := make([]float32, len(tc.q))
			var tv float64
			for i, v := range tc.q {
				q[i] = float32(v)
				tv += math.Abs(v-p[i]) / 2
			}
			counts := make([]int, len(p))
			held := 0
			for i := range trials {
				opt := sample.Options{Temperature: 1, Seed: uint64(i)}
				s := sample.New(opt)
				tr := newTree(0)
				tr.nodes[0].expanded = true
				for _, tok := range s.RaceAhead(nil, q, 0, tc.children) {
					tr.add(0, tok, q[tok])
				}
				d := walkDecoder(tr, s)
				// The children are not in the snapshot: walk stops at
				// the root, and the emitted token is the sampled one.
				_, next, node := d.walk(snapshot{slot: []int{0}}, func(int) []float32 { return logits })
				if alone := sample.New(opt).Sample(logits, []int32{0}); next != alone {
					t.Fatalf("seed %d: the walk emitted %d, the target alone draws %d", i, next, alone)
				}
				counts[next]++
				if node >= 0 {
					held++
				}
			}
			stat, df := chiSquare(counts, p, trials)
			if limit := chiSquareLimit(df); stat > limit {
				t.Errorf("output is not distributed as p: chi-square %.1f > %.1f (df %d); counts %v", stat, limit, df, counts)
			}
			share := float64(held) / trials
			// Binomial noise over 20k trials is under 0.004 a standard deviation.
			if bound := (1 - tv) / (1 + tv); share < bound-0.015 {
				t.Errorf("the children held the target's token in %.3f of trials, under the coupling's bound %.3f (d %.2f)", share, bound, tv)
			}
			t.Logf("chi-square %.1f (df %d); the children held the target's token in %.1f%% of trials (bound %.1f%%)", stat, df, 100*share, 100*(1-tv)/(1+tv))
		})
	}
}

// TestCostAwarePausesWhileDraftingDoesNotPay: on a compute-bound target
// whose pass costs 100 µs a row (10 000 tokens a second alone), rounds
// that emit 2 tokens in 1 ms lose by far, so drafting pauses at once for
// as many rounds as make the probe's loss a tenth of the pause: the three
// rounds took 3 ms for 6 tokens the target makes in 0.6 ms, 24 rounds
// lost, so 240. Rounds that lose a little (4 tokens in 0.6 ms) pause for
// less (60). The round that feeds the draft the pause's tokens costs the
// pause its extra time, and while pausing still wins the next pause is
// twice as long, up to maxPause. Rounds that pay end the pausing, and
// neither NoPause, a group's shared passes nor a streamed target ever
// pause.
func TestCostAwarePausesWhileDraftingDoesNotPay(t *testing.T) {
	const row = 100 * time.Microsecond
	start := TreeState{Branches: 1} // a round's first question: no draft step yet
	drafted := Outcome{Verified: 4, Accepted: 1, SumConf: 1, Time: 5 * row, Draft: 5 * row}
	paused := Outcome{Time: row}
	// pauses reports how many round starts in a row c skips drafting at,
	// observing a paused pass after each.
	pauses := func(c *CostAware) int {
		n := 0
		for c.Verify(start) {
			c.Observe(paused)
			if n++; n > 10*maxPause {
				t.Fatal("drafting never resumed")
			}
		}
		return n
	}
	probe := func(c *CostAware, o Outcome) {
		for range decideAfter {
			if c.Verify(start) {
				t.Fatal("paused before drafting was measured")
			}
			c.Observe(o)
		}
	}
	slight := &CostAware{}
	probe(slight, Outcome{Verified: 4, Accepted: 3, SumConf: 3, Time: 5 * row, Draft: row})
	if n := pauses(slight); n != 60 {
		t.Fatalf("4 tokens in 0.6 ms against the target's 10 a ms: paused %d rounds, want 60", n)
	}
	c := &CostAware{}
	probe(c, drafted)
	if n := pauses(c); n != 240 {
		t.Fatalf("2 tokens a ms against the target's 10 a ms: paused %d rounds, want 240", n)
	}
	// The catch-up round takes 1 ms more than a drafted round: the pause
	// made 240 tokens in 25 ms, still far above the drafted rate.
	c.Observe(Outcome{Verified: 4, Accepted: 1, SumConf: 1, Time: 5 * row, Draft: 15 * row})
	for range decideAfter {
		c.Observe(drafted)
	}
	if n := pauses(c); n != maxPause {
		t.Fatalf("the pause won again: paused %d rounds, want %d", n, maxPause)
	}
	// A catch-up that takes 100 ms more than a drafted round (the pause
	// now makes 256 tokens in 125.6 ms), then rounds that pay: drafting
	// goes on.
	c.Observe(Outcome{Verified: 4, Accepted: 1, SumConf: 1, Time: 5 * row, Draft: 1005 * row})
	good := Outcome{Verified: 8, Accepted: 8, SumConf: 8, Time: 9 * row, Draft: 4 * row}
	for range 4 * decideAfter {
		if c.Verify(start) {
			t.Fatal("paused although the pause lost to drafting and drafted rounds make 9 tokens in 1.3 ms")
		}
		c.Observe(good)
	}
	for _, tc := range []struct {
		name string
		c    *CostAware
		o    Outcome
	}{
		{"NoPause", &CostAware{NoPause: true}, drafted},
		{"a group's passes", &CostAware{}, Outcome{Verified: 4, Accepted: 1, SumConf: 1, Time: 15 * row, Draft: 10 * row, Others: 10}},
		// Streamed: the pass waits on IO, so the target alone makes a
		// token a 10 ms pass where drafted rounds make 2 in 11 ms.
		{"a streamed target", &CostAware{}, Outcome{Verified: 4, Accepted: 1, SumConf: 1, Time: 100 * row, IOWait: 95 * row, Draft: 10 * row}},
	} {
		for range 4 * decideAfter {
			if tc.c.Verify(start) {
				t.Fatalf("%s: paused", tc.name)
			}
			tc.c.Observe(tc.o)
		}
	}
}
