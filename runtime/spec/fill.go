package spec

import "slices"

// A Filler is a Trigger that knows how many drafted tokens a target pass
// checks at no extra cost: a streamed target's pass lasts as long as its
// weights take to stream in until its compute outgrows that. The decoder
// fills the rows a tree leaves free, up to that count, with tokens the
// draft proposed but did not extend: alternatives it did not branch on
// (below the branch threshold or past the branch cap) and branches pruned
// below the confidence floor. They cost no draft step, and one the target
// picks gains its token and the target's own token after it.
type Filler interface {
	FreeRows() int
	// DepthFactor calibrates C at depth d: how many times more often the
	// target accepts a drafted token that deep than its C says.
	DepthFactor(d int) float64
}

// fill marks the pruned nodes the next verification checks as well, as
// many as the trigger's free rows leave room for (nil: none).
func (d *Decoder) fill() []bool {
	if d.filler == nil {
		return nil
	}
	room := min(d.filler.FreeRows(), d.maxNodes(d.cfg.MaxTree)) - d.tree.size()
	marks, n := d.tree.fill(room, d.filler.DepthFactor)
	d.stats.Filled += n
	return marks
}

// fill picks up to room candidates for a verification's free rows, most
// likely accepted first: pruned nodes and alternatives whose parent the
// target checks anyway, ranked by C (an alternative's is its parent's C
// times its probability) calibrated by factor at its depth. Alternatives
// it picks become pruned children, so the draft still does not extend
// them. It returns the picks marked by node index (nil when none) and
// their count.
func (t *tree) fill(room int, factor func(depth int) float64) ([]bool, int) {
	if room <= 0 {
		return nil, 0
	}
	type candidate struct {
		parent, node int // node -1: an alternative not yet in the tree
		tok          int32
		prob         float32
		score        float64
	}
	var cands []candidate
	for i := range t.nodes {
		n := &t.nodes[i]
		if n.pruned {
			if p := n.parent; p >= 0 && !t.nodes[p].pruned {
				cands = append(cands, candidate{parent: p, node: i, score: n.conf * factor(n.depth)})
			}
			continue
		}
		for _, a := range n.alts {
			if t.child(i, a.tok) < 0 {
				cands = append(cands, candidate{parent: i, node: -1, tok: a.tok, prob: a.prob,
					score: n.conf * float64(a.prob) * factor(n.depth+1)})
			}
		}
	}
	if len(cands) == 0 {
		return nil, 0
	}
	// Ties go to the older parent, so fills are deterministic.
	slices.SortStableFunc(cands, func(a, b candidate) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return a.parent - b.parent
	})
	cands = cands[:min(room, len(cands))]
	for i, c := range cands {
		if c.node < 0 {
			cands[i].node = t.add(c.parent, c.tok, c.prob)
			t.nodes[cands[i].node].pruned = true
		}
	}
	marks := make([]bool, len(t.nodes))
	for _, c := range cands {
		marks[c.node] = true
	}
	return marks, len(cands)
}
