package spec

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// snapshot is the tree as it went to the target: slot[node] is the
// node's batch slot, -1 for a pruned node; nodes past the end were
// drafted while it verified.
type snapshot struct {
	slot []int
}

// at returns node n's slot, or -1 when the target did not see it.
func (s snapshot) at(n int) int {
	if n < len(s.slot) {
		return s.slot[n]
	}
	return -1
}

// snapshot puts the prompt tokens the target has not seen (before the
// first verification), the root, every unpruned drafted node and the
// pruned ones fill marks into the target batch, in tree order, each slot
// under its parent's.
func (d *Decoder) snapshot(fill []bool) snapshot {
	t := d.tree
	s := snapshot{slot: make([]int, len(t.nodes))}
	b := &d.tb
	b.Reset()
	tip := -1 // the slot the root follows
	if len(d.prefix) > 0 {
		tip = b.Chain(d.prefix, int32(d.tcache.Len(d.tseq)), d.tseq, -1, false)
	}
	root := int32(d.rootPos())
	for i := range t.nodes {
		n := &t.nodes[i]
		s.slot[i] = -1
		if n.pruned && (i >= len(fill) || !fill[i]) {
			continue
		}
		parent := tip
		if n.parent >= 0 {
			parent = s.slot[n.parent]
		}
		s.slot[i] = b.Add(n.tok, root+int32(n.depth), d.tseq, parent, true)
	}
	return s
}

// verify runs the target over the snapshot's batch: one pass for the
// whole tree.
func (d *Decoder) verify() error {
	wait0, read0 := d.ioTimes()
	start := time.Now()
	err := d.target.Forward(&d.tb, d.tcache, &d.tout)
	d.pass = time.Since(start)
	wait, read := d.ioTimes()
	d.passIO, d.passRead = wait-wait0, read-read0
	d.stats.TargetTime += d.pass
	if err != nil {
		return fmt.Errorf("spec: verify: %w", err)
	}
	d.stats.TargetPasses++
	return nil
}

// ioTimes are the target's total wait for streamed weights so far, and
// the time its streamer has spent reading them (zero when resident).
func (d *Decoder) ioTimes() (wait, read time.Duration) {
	if ss, ok := d.target.StreamStats(); ok {
		return ss.Stall, ss.ReadTime
	}
	return 0, 0
}

// verifyPipelined runs the verification in the background and keeps the
// draft extending the tree on the lane whenever the target lets go of it
// (while its next weights stream in). What the draft adds under the token
// the target picks carries into the next round.
func (d *Decoder) verifyPipelined(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- d.verify() }()
	var stopped bool
	var draftErr error
	err := draftDuringPass(ctx, d.cfg.Lane, done, func() *Decoder {
		if stopped || d.pipelineFull() {
			return nil
		}
		return d
	}, func(_ *Decoder, err error) { stopped, draftErr = true, err })
	if err == nil {
		err = draftErr
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// draftDuringPass runs draft steps on the lane whenever the target pass
// in flight lets go of it, until the pass ends (done) or next has no
// decoder left to extend. A decoder whose step fails, or drafts nothing
// (its pacer picked no leaf), goes to stop with the error or nil; next
// should not offer it again this pass, or the loop would spin on it
// beside the pass. It returns the pass's error.
func draftDuringPass(ctx context.Context, lane *Lane, done <-chan error, next func() *Decoder, stop func(*Decoder, error)) error {
	for ctx.Err() == nil {
		d := next()
		if d == nil {
			break
		}
		if !lane.tryDraft() {
			select {
			case err := <-done:
				return err
			case <-lane.free:
			case <-ctx.Done():
			}
			continue
		}
		stepped, err := d.draftStep(d.cfg.PipelineCap)
		lane.Unlock()
		if stepped {
			d.stats.PipelineSteps++
		}
		if err != nil || !stepped {
			stop(d, err)
		}
		select {
		case err := <-done:
			return err
		default:
		}
	}
	return <-done
}

// pipelineFull reports whether the draft has nothing left to do while
// the target verifies.
func (d *Decoder) pipelineFull() bool {
	return d.tree.size() >= d.maxNodes(d.cfg.PipelineCap) || len(d.openLeaves(nil)) == 0
}

// accept walks down the verified tree from the root, at each node taking
// the child the target's choice selects, emits the path and the target's
// own token after it, commits the path's KV rows in both models and
// re-roots the tree at that token (keeping what the draft grew under it).
// logits is the target's row of a slot of the tree's batch; others are
// the rows other sequences' trees added to the pass (Group).
func (d *Decoder) accept(snap snapshot, logits func(slot int) []float32, others int) ([]int32, error) {
	t := d.tree
	path, next, nextNode := d.walk(snap, logits)
	x := path[len(path)-1]

	verified := len(d.tb.Tokens) - len(d.prefix) - 1
	accepted := len(path) - 1
	d.stats.Verified += verified
	d.stats.Accepted += accepted
	d.stats.MaxTree = max(d.stats.MaxTree, verified)
	if verified == 0 {
		d.stats.Undrafted++
	}
	for len(d.stats.AcceptLen) <= accepted {
		d.stats.AcceptLen = append(d.stats.AcceptLen, 0)
	}
	d.stats.AcceptLen[accepted]++
	for _, n := range path[1:] {
		if t.nodes[n].pruned { // only a fill puts a pruned node in the batch
			d.stats.FilledAccepted++
		}
	}
	var byDepth []float64
	for i := 1; i < len(snap.slot); i++ {
		if snap.slot[i] >= 0 {
			n := &t.nodes[i]
			for len(byDepth) < n.depth {
				byDepth = append(byDepth, 0)
			}
			byDepth[n.depth-1] += n.conf
		}
	}
	d.cfg.Trigger.Observe(Outcome{Verified: verified, Prompt: len(d.prefix), Others: others, Accepted: accepted, Branch: d.bestBranch(x, snap), Correct: accepted,
		SumConf: sum(byDepth), ConfByDepth: byDepth, Time: d.pass, IOWait: d.passIO, IORead: d.passRead, Draft: d.roundDraft})

	// The target evaluated every slot; keep the prompt's rows and the
	// path's.
	slots := make([]int, len(d.prefix), len(d.prefix)+len(path))
	for i := range slots {
		slots[i] = i
	}
	for _, n := range path {
		slots = append(slots, snap.at(n))
	}
	if err := d.tcache.Commit(d.tseq, slots); err != nil {
		return nil, fmt.Errorf("spec: target: %w", err)
	}
	d.prefix = d.prefix[:0]
	// The draft has rows for the expanded nodes, which are a prefix of
	// the path (a node is proposed only by an expanded parent).
	var rows []int
	for _, n := range path {
		if r := t.nodes[n].row; r >= 0 {
			rows = append(rows, r)
		}
	}
	if len(rows) == len(path) {
		// The root has a row, so an earlier draft step committed the
		// pending tokens: none are left.
		keep := -1
		if nextNode >= 0 {
			keep = t.nodes[nextNode].row
		}
		remap, err := d.dcache.CommitKeep(d.dseq, rows, keep)
		if err != nil {
			return nil, fmt.Errorf("spec: draft: %w", err)
		}
		if nextNode >= 0 {
			d.tree = t.reroot(nextNode, remap)
			d.stats.KeptNodes += d.tree.size()
		} else {
			d.tree = newTree(next)
		}
	} else {
		// The path's tokens without rows join those still pending (an
		// unexpanded root has none of its own, and the tokens before it
		// may still be waiting).
		if err := d.dcache.Commit(d.dseq, rows); err != nil {
			return nil, fmt.Errorf("spec: draft: %w", err)
		}
		for _, n := range path[len(rows):] {
			d.pending = append(d.pending, t.nodes[n].tok)
		}
		d.tree = newTree(next)
	}

	out := make([]int32, 0, len(path))
	for _, n := range path[1:] {
		out = append(out, t.nodes[n].tok)
	}
	out = append(out, next)
	d.history = append(d.history, out...)
	d.stats.Emitted += len(out)
	return out, nil
}

// walk goes down the verified tree from the root, at each node taking the
// child the target's choice selects (rows gives the target's logits of a
// batch slot). It returns the accepted path (root first), the token the
// target chose after it and that token's node (-1 when the draft did not
// propose it).
func (d *Decoder) walk(snap snapshot, rows func(slot int) []float32) (path []int, next int32, nextNode int) {
	x := 0
	path = []int{0}
	hist := slices.Clip(d.history) // appends copy, leaving history as it is
	for {
		tok, y := d.choose(x, rows(snap.at(x)), hist, snap)
		if ch := d.tree.nodes[x].children; len(ch) > 0 && snap.at(ch[0]) >= 0 && d.raced() {
			// Did the target draw the draft's first finisher?
			first, chance := d.tree.nodes[ch[0]], 0.0
			if c := d.tree.nodes[x].conf; c > 0 {
				chance = first.conf / c
			}
			d.agree.observe(float64(first.prob), chance, y == ch[0])
		}
		if y < 0 || snap.at(y) < 0 {
			return path, tok, y
		}
		path = append(path, y)
		hist = append(hist, tok)
		x = y
	}
}

// choose is the target's decision at node x, whose logits are row: the
// token that follows x and the child node holding it (-1 if none).
//
//   - Greedy: the target's own greedy token; a child matches only if the
//     draft guessed exactly it.
//   - Sampling: the target's own draw, with the next uniform of its
//     stream, one a token as the target alone spends them; a child
//     matches only if the draft proposed exactly it. The text is then
//     the target's alone for the same seed, whatever the trees were
//     (the draft proposes the token its own distribution gives for the
//     same uniform, to be matched often).
//   - BiLD: accept the draft's child unless the target's cross-entropy
//     for it exceeds Rollback; otherwise (or past the chain) the target's
//     own token.
func (d *Decoder) choose(x int, row []float32, hist []int32, snap snapshot) (int32, int) {
	t := d.tree
	if d.cfg.Method == BiLD {
		for _, c := range t.nodes[x].children {
			if snap.at(c) < 0 {
				continue
			}
			d.probs = softmaxInto(d.probs, row)
			if -math.Log(float64(d.probs[t.nodes[c].tok])) <= d.cfg.Rollback {
				return t.nodes[c].tok, c
			}
		}
	}
	tok := d.sampler.Sample(row, hist)
	return tok, t.child(x, tok)
}

// bestBranch is N_all for the adaptive trigger: the length of the branch
// that matched the accepted path best. The accepted path ends at x; the
// branch follows the draft's most confident verified children below it.
func (d *Decoder) bestBranch(x int, snap snapshot) int {
	t := d.tree
	for {
		best := -1
		for _, c := range t.nodes[x].children {
			if snap.at(c) >= 0 && (best < 0 || t.nodes[c].prob > t.nodes[best].prob) {
				best = c
			}
		}
		if best < 0 {
			return t.nodes[x].depth
		}
		x = best
	}
}
