package spec

import "slices"

// Pacer decides which branches of the tree the draft extends next.
type Pacer interface {
	// Pick appends to dst up to n of the leaves (open branches) to extend
	// in the next draft step, best first. budget is M, the draft tokens
	// the tree may hold before it is verified.
	Pick(dst []int, t *tree, leaves []int, budget, n int) []int
}

// FairPacer is LLMCad's confidence pacer: branch x's fair share of the
// draft budget M is M·C_x/ΣC_i (C the branch's cumulative confidence) and
// the branch furthest below its share, share − length, is extended next.
// Repeating that solves min_x (T_x − M·C_x/ΣC_i), a max-min fair split of
// draft steps in proportion to how likely each branch is to be accepted.
type FairPacer struct{}

// UniformPacer gives every open branch the same share, M/branches: it
// extends the shortest branch (breadth first). It is the "no pacer"
// ablation.
type UniformPacer struct{}

// ChainPacer extends the deepest branch (the classic linear draft).
type ChainPacer struct{}

func (FairPacer) Pick(dst []int, t *tree, leaves []int, budget, n int) []int {
	var sum float64
	for _, l := range leaves {
		sum += t.nodes[l].conf
	}
	return pickBy(dst, leaves, n, func(l int) float64 {
		nd := &t.nodes[l]
		share := 0.0
		if sum > 0 {
			share = float64(budget) * nd.conf / sum
		}
		return share - float64(nd.depth)
	}, t)
}

func (UniformPacer) Pick(dst []int, t *tree, leaves []int, budget, n int) []int {
	share := float64(budget) / float64(max(1, len(leaves)))
	return pickBy(dst, leaves, n, func(l int) float64 { return share - float64(t.nodes[l].depth) }, t)
}

func (ChainPacer) Pick(dst []int, t *tree, leaves []int, budget, n int) []int {
	return pickBy(dst, leaves, n, func(l int) float64 { return float64(t.nodes[l].depth) }, t)
}

// pickBy appends the n leaves with the highest score; ties go to the more
// confident branch, then to the older node, so picks are deterministic.
func pickBy(dst, leaves []int, n int, score func(int) float64, t *tree) []int {
	c := slices.Clone(leaves)
	slices.SortStableFunc(c, func(a, b int) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		case t.nodes[a].conf > t.nodes[b].conf:
			return -1
		case t.nodes[a].conf < t.nodes[b].conf:
			return 1
		}
		return a - b
	})
	return append(dst, c[:min(n, len(c))]...)
}
