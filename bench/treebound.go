package bench

import (
	"fmt"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// DraftRanks measures how well a draft predicts a target: it runs the
// draft over each reference sequence (a prompt and the target's own
// continuation of it) and, at every position of the continuation, finds
// the rank of the target's token in the draft's distribution after the
// tokens before it. It returns the share of positions at each rank:
// ranks[k-1] for rank k, k = 1..maxRank; positions ranked lower are
// left out (1 − Σ ranks).
func DraftRanks(draftPath string, threads int, prompts, outputs [][]int32, maxRank int) (ranks []float64, positions int, err error) {
	if len(prompts) != len(outputs) {
		return nil, 0, fmt.Errorf("bench: draft ranks: %d prompts for %d outputs", len(prompts), len(outputs))
	}
	f, err := weights.Open(draftPath)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	m, err := model.Load(f, model.Options{Threads: threads})
	if err != nil {
		return nil, 0, err
	}
	defer m.Close()
	counts := make([]int, maxRank)
	longest := 0
	for i, prompt := range prompts {
		longest = max(longest, len(prompt)+len(outputs[i]))
	}
	cache, err := m.NewCache(min(max(longest, 1), m.Config().Context), weights.F32)
	if err != nil {
		return nil, 0, err
	}
	var b model.Batch
	var out model.Logits
	for i, prompt := range prompts {
		if len(prompt) == 0 || len(outputs[i]) == 0 {
			continue
		}
		seq := append(append([]int32(nil), prompt...), outputs[i]...)
		seq = seq[:min(len(seq), m.Config().Context)]
		id, err := cache.NewSeq()
		if err != nil {
			return nil, 0, err
		}
		// One pass over the whole sequence, logits where the
		// continuation is predicted.
		b.Reset()
		for p, tok := range seq[:len(seq)-1] {
			b.Add(tok, int32(p), id, p-1, p >= len(prompt)-1)
		}
		err = m.Forward(&b, cache, &out)
		cache.Free(id)
		if err != nil {
			return nil, 0, fmt.Errorf("bench: draft ranks: %w", err)
		}
		for p := len(prompt) - 1; p+1 < len(seq); p++ {
			row := out.Row(p)
			want := row[seq[p+1]]
			rank := 0
			for _, v := range row {
				if v > want {
					rank++
				}
			}
			positions++
			if rank < maxRank {
				counts[rank]++
			}
		}
	}
	if positions == 0 {
		return nil, 0, fmt.Errorf("bench: draft ranks: no positions to rank")
	}
	ranks = make([]float64, maxRank)
	for k, c := range counts {
		ranks[k] = float64(c) / float64(positions)
	}
	return ranks, positions, nil
}

// BestTrees returns, for every tree size n = 0..maxNodes, the tokens per
// target pass of the best token tree of n drafted nodes: the accepted
// tokens a verification expects, plus the target's own token. ranks[k-1]
// is the chance that the target's token is the draft's k-th choice
// (DraftRanks), taken as the same at every node and independent of the
// path above it, as in Sequoia (Chen et al., 2024), whose dynamic
// program this is: the best tree spends its nodes on the children, by
// rank, and the subtrees under them that gain the most.
func BestTrees(ranks []float64, maxNodes int) []float64 {
	// best[n]: accepted tokens expected from n nodes below a node the
	// target reaches. g[k][m]: the most that m nodes earn as children of
	// ranks k+1.. and their subtrees (g[len(ranks)] is all zero).
	best := make([]float64, maxNodes+1)
	g := make([][]float64, len(ranks)+1)
	for k := range g {
		g[k] = make([]float64, maxNodes+1)
	}
	for m := 1; m <= maxNodes; m++ {
		for k := len(ranks) - 1; k >= 0; k-- {
			v := g[k+1][m] // no child of rank k+1
			for sub := 1; sub <= m; sub++ {
				// A child of rank k+1 with sub−1 nodes below it.
				v = max(v, ranks[k]*(1+best[sub-1])+g[k+1][m-sub])
			}
			g[k][m] = v
		}
		best[m] = g[0][m]
	}
	for n := range best {
		best[n]++
	}
	return best
}
