package spec

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
)

// draftStep extends the branches the pacer picks by one token each, in
// one draft Forward: each picked leaf is evaluated (its KV row hangs
// under its parent's, so no shared prefix is evaluated again) and its
// children are proposed from the draft's distribution after it. Accepted
// tokens the draft has not seen yet (pending) go first, as a chain under
// the committed rows. It reports whether it stepped: not when no leaf is
// open or the pacer picks none.
func (d *Decoder) draftStep(cap int) (stepped bool, err error) {
	b := &d.db
	b.Reset()
	st := d.draftRows(b)
	if st.picks == nil {
		return false, nil // nothing to extend: the tree is as large as it gets this round
	}
	start := time.Now()
	err = d.draft.Forward(b, d.dcache, &d.dout)
	elapsed := time.Since(start)
	if err != nil {
		d.stats.DraftTime += elapsed
		return false, fmt.Errorf("spec: draft step: %w", err)
	}
	return true, d.draftTake(st, &d.dout, cap, elapsed)
}

// draftRows adds to b the rows of the decoder's next draft step (pending
// tokens, then the pacer's picks) and returns what draftTake needs; no
// picks (and no rows) when no leaf is open or the pacer picks none.
func (d *Decoder) draftRows(b *model.Batch) draftRound {
	t := d.tree
	open := d.openLeaves(nil)
	if len(open) == 0 {
		return draftRound{}
	}
	r := draftRound{first: b.Len(), nodes: len(t.nodes), before: t.confByDepth(nil), had: d.dcache.Tentative(d.dseq)}
	r.picks = d.cfg.Pacer.Pick(nil, t, open, d.cfg.MaxTree, d.cfg.DraftBatch)
	if len(r.picks) == 0 {
		return draftRound{} // a pacer that picks nothing ends the growth
	}
	if len(d.pending) > 0 {
		// Only the unexpanded root can be open behind pending tokens.
		r.picks = r.picks[:1]
	}
	rootPos := int32(d.rootPos() - d.shift) // in the draft's window
	// The slot the root hangs under: the last pending token's.
	last := -1
	base := d.dcache.Len(d.dseq)
	for i, tok := range d.pending {
		last = b.Add(tok, int32(base+i), d.dseq, last, false)
	}
	for _, x := range r.picks {
		n := &t.nodes[x]
		pos := rootPos + int32(n.depth)
		switch {
		case n.parent < 0:
			b.Add(n.tok, pos, d.dseq, last, true)
		default:
			b.AddAfter(n.tok, pos, d.dseq, t.nodes[n.parent].row, true)
		}
	}
	r.rows = b.Len() - r.first
	return r
}

// draftRound is one decoder's part of a draft Forward.
type draftRound struct {
	picks  []int     // the nodes evaluated, after the pending tokens
	first  int       // the decoder's first slot in the batch
	rows   int       // its slots
	nodes  int       // the tree's size before the step
	before []float64 // the tree's Σ C by depth before the step
	had    int       // the draft's tentative rows of the sequence before the step
}

// draftTake reads the decoder's rows of a draft Forward (logits by batch
// slot in out) that took elapsed for its rows: it proposes the picks'
// children and commits the pending tokens.
func (d *Decoder) draftTake(r draftRound, out *model.Logits, cap int, elapsed time.Duration) error {
	t := d.tree
	d.stats.DraftTime += elapsed
	d.stats.DraftSteps++
	d.stats.DraftTokens += r.rows
	for i, x := range r.picks {
		slot := len(d.pending) + i // the sequence's own rows count from its first
		t.nodes[x].row = r.had + slot
		t.nodes[x].expanded = true
		d.propose(x, out.Row(r.first+slot), cap)
	}
	if len(d.pending) > 0 {
		rows := make([]int, len(d.pending))
		for i := range rows {
			rows[i] = r.had + i
		}
		remap, err := d.dcache.CommitKeep(d.dseq, rows, t.nodes[0].row)
		if err != nil {
			return fmt.Errorf("spec: draft: %w", err)
		}
		for i := range t.nodes {
			if row := t.nodes[i].row; row >= 0 {
				t.nodes[i].row = remap[row]
			}
		}
		d.pending = d.pending[:0]
	}
	// The step's gain by depth: the tree's Σ C by depth now less before.
	gain := t.confByDepth(nil)
	for i := range min(len(r.before), len(gain)) {
		gain[i] -= r.before[i]
	}
	d.last = stepInfo{byDepth: gain, added: len(t.nodes) - r.nodes, time: elapsed}
	return nil
}

// stepInfo is what one draft step added and cost.
type stepInfo struct {
	byDepth []float64 // Σ C it added, by depth (index d-1 for depth d)
	added   int
	time    time.Duration
}

// propose adds the children of node x from the draft's logits after it:
// the most likely token, and every other above the branch threshold while
// branches are left. Sampling proposes as many, but the first finishers of
// the draft's distribution raced with the word the target will draw x's
// child with (sample.Sampler.Draw): where the two distributions agree,
// the target's own draw picks one of them (see choose), the first most
// often, which its chance says (agreement). BiLD hands over instead
// when the draft's top probability is below its fallback threshold. While
// the decoder fills free verification rows, the likely tokens left out
// are kept as x's alternatives.
func (d *Decoder) propose(x int, logits []float32, cap int) {
	t := d.tree
	if t.nodes[x].depth >= d.maxDepth() {
		return // no position for a child
	}
	room := d.cfg.MaxBranches - len(t.leaves(nil)) // x, expanded now, gives way to its children
	room = min(room, d.maxNodes(cap)-t.size())
	// Alternatives are kept only while verifications have rows to fill
	// (never with a resident target).
	keepAlts := d.filler != nil && d.filler.FreeRows() > 0
	if room <= 0 && !keepAlts {
		return
	}
	sampling := !d.sampler.Greedy()
	var q []float32
	if sampling {
		q = d.proposer.Probs(logits, d.pathHistory(x))
	} else {
		d.probs = softmaxInto(d.probs, logits)
		q = d.probs
	}
	top := topTokens(q, maxProposals)
	if d.cfg.Method == BiLD && float64(q[top[0]]) < d.cfg.Fallback {
		d.handover = true
		return
	}
	want := 0
	if room > 0 {
		want = 1
	}
	for _, id := range top[1:] {
		if float64(q[id]) > d.cfg.BranchThreshold && want < room {
			want++
		}
	}
	picks := top[:want]
	if sampling {
		// The walk draws one token a node down the accepted path, so
		// x's child is the target's draw x.depth draws from now.
		d.race = d.sampler.RaceAhead(d.race[:0], q, t.nodes[x].depth, want)
		picks = d.race
	}
	left := 1.0 // the chance no earlier child is the target's draw
	for r, id := range picks {
		chance := float64(q[id])
		if d.raced() {
			if r == 0 {
				chance = d.agree.chance(chance)
			}
			// The target draws one token: the children's chances add up
			// to at most 1.
			chance = min(chance, left)
			left -= chance
		}
		d.addChild(x, id, q[id], chance)
	}
	if !keepAlts {
		return
	}
	for _, id := range top {
		if t.child(x, id) < 0 {
			t.nodes[x].alts = append(t.nodes[x].alts, alt{id, q[id]})
		}
	}
}

// agreement estimates how often the target's draw is the first finisher
// of the draft's race for the same word, the child a sampled node
// proposes first. The draft's probability q of that token understates
// it: raced with the target's word, the draft's winner is the target's
// wherever the two distributions agree, whatever q. Over 20 seeds of 200
// tokens from stories260K with llama2xs at T 0.8, first finishers whose
// q was below 0.2 were the target's draw 43% of the time, those between
// 0.4 and 0.6 73%, and those above 0.8 97%: q + (1 − q)·ρ with ρ near
// 0.38 at every q, where second and third finishers matched at their q
// (0.198 against 0.194, 0.098 against 0.141). ρ is fitted to the
// verified first finishers: E[hit − q] = (1 − q)·ρ.
type agreement struct {
	excess, room float64 // decayed sums of hit − q and 1 − q
	// The record of every first finisher observed: how many, how many
	// the target drew, and the sums of their q and of the chance their
	// tree gave them (TestFirstFinishersChanceIsCalibrated).
	seen, hits  int
	qs, chances float64
}

// agreementPrior is ρ before any verification, worth agreementWeight
// first finishers; agreementDecay weighs each older one less, so ρ
// follows a generation whose text gets harder or easier.
const (
	agreementPrior  = 0.3
	agreementWeight = 4
	agreementDecay  = 1 - 1.0/64
)

// rho is the fitted ρ, in [0, 1].
func (a agreement) rho() float64 {
	return min(1, max(0, (a.excess+agreementPrior*agreementWeight)/(a.room+agreementWeight)))
}

// chance is the chance the target draws a first finisher of probability q.
func (a agreement) chance(q float64) float64 { return q + (1-q)*a.rho() }

// observe adds a verified first finisher of probability q, given chance
// when proposed: hit when the target drew it.
func (a *agreement) observe(q, chance float64, hit bool) {
	h := 0.0
	if hit {
		h = 1
		a.hits++
	}
	a.excess = agreementDecay*a.excess + h - q
	a.room = agreementDecay*a.room + 1 - q
	a.seen++
	a.qs += q
	a.chances += chance
}

// raced reports whether a node's children are the first finishers of
// the draft's race that the target's own draw picks among (sampling, but
// for BiLD, which accepts by its own rule: choose).
func (d *Decoder) raced() bool { return !d.sampler.Greedy() && d.cfg.Method != BiLD }

// maxProposals is how many of the draft's most likely tokens after a
// node it considers: children first, then alternatives.
const maxProposals = 8

// addChild adds a child, the draft's probability p of its token and the
// chance the target takes it (p but for a sampled race's first
// finisher), and prunes it at once when its branch is already below the
// confidence floor.
func (d *Decoder) addChild(x int, tok int32, p float32, chance float64) int {
	c := d.tree.add(x, tok, p)
	d.tree.nodes[c].conf = d.tree.nodes[x].conf * chance
	if d.tree.nodes[c].conf < d.cfg.Floor {
		d.tree.nodes[c].pruned = true
	}
	return c
}

// pathHistory is the token history at node x: the prompt and emitted
// tokens, then the path below the root.
func (d *Decoder) pathHistory(x int) []int32 {
	p := d.tree.path(x)
	h := slices.Clip(d.history)
	for _, n := range p[1:] {
		h = append(h, d.tree.nodes[n].tok)
	}
	return h
}

// softmaxInto writes softmax(logits) into dst (grown as needed).
func softmaxInto(dst, logits []float32) []float32 {
	if cap(dst) < len(logits) {
		dst = make([]float32, len(logits))
	}
	dst = dst[:len(logits)]
	m := float32(math.Inf(-1))
	for _, v := range logits {
		if v > m {
			m = v
		}
	}
	copy(dst, logits)
	sum := kernels.ExpSum(dst, m)
	for i := range dst {
		dst[i] = float32(float64(dst[i]) / sum)
	}
	return dst
}

// topTokens returns the k most likely tokens of p, most likely first,
// ties to the lower id (as greedy decoding breaks them).
func topTokens(p []float32, k int) []int32 {
	k = max(1, min(k, len(p)))
	top := make([]int32, 0, k)
	for i, v := range p {
		if len(top) == k && v <= p[top[k-1]] {
			continue
		}
		j := len(top)
		if j == k {
			j--
		} else {
			top = append(top, 0)
		}
		for j > 0 && v > p[top[j-1]] {
			top[j] = top[j-1]
			j--
		}
		top[j] = int32(i)
	}
	return top
}
