package spec

import "math"

// node is one token of the draft's tree. The root is the last token the
// output has accepted: neither model has its KV row yet. Every other node
// is a guess of the draft's.
type node struct {
	tok    int32
	parent int     // node index; -1 for the root
	depth  int     // tokens below the root (root 0)
	conf   float64 // C: product down the path of the chances the target takes each token (root 1; see addChild)
	prob   float32 // the draft's probability of tok where it was proposed (root 1)
	row    int     // the draft's tentative KV row for this node, -1 until it evaluates it

	expanded bool // the draft evaluated it and proposed its children
	// pruned nodes fell below the confidence floor: the draft does not
	// extend them and the target does not see them, but they stay as
	// children (a sampled draw of one still counts, and the target may
	// still pick its token as the next one).
	pruned   bool
	children []int
	// alts are the draft's next most likely tokens after an expanded
	// node that it did not branch on: below the branch threshold or past
	// the branch cap. A verification's free rows may check them; one that
	// does becomes a pruned child, which later fills take as such.
	alts []alt
}

// alt is a token the draft proposed without branching on it.
type alt struct {
	tok  int32
	prob float32
}

// tree is the draft's token tree since the last verification, in
// topological order (a parent before its children), so its nodes can go
// to the target as batch slots in index order.
type tree struct {
	nodes []node
}

func newTree(root int32) *tree {
	return &tree{nodes: []node{{tok: root, parent: -1, conf: 1, prob: 1, row: -1}}}
}

// add appends a child of parent and returns its index.
func (t *tree) add(parent int, tok int32, prob float32) int {
	p := &t.nodes[parent]
	t.nodes = append(t.nodes, node{tok: tok, parent: parent, depth: p.depth + 1, conf: p.conf * float64(prob), prob: prob, row: -1})
	i := len(t.nodes) - 1
	t.nodes[parent].children = append(t.nodes[parent].children, i)
	return i
}

// child returns the child of n holding tok, or -1.
func (t *tree) child(n int, tok int32) int {
	for _, c := range t.nodes[n].children {
		if t.nodes[c].tok == tok {
			return c
		}
	}
	return -1
}

// size is the number of drafted (non-root, unpruned) nodes.
func (t *tree) size() int {
	n := 0
	for i := 1; i < len(t.nodes); i++ {
		if !t.nodes[i].pruned {
			n++
		}
	}
	return n
}

// leaves appends the branches the draft may still extend: unpruned nodes
// it has not expanded (the root, before the first draft step).
func (t *tree) leaves(dst []int) []int {
	for i := range t.nodes {
		if n := &t.nodes[i]; !n.expanded && !n.pruned {
			dst = append(dst, i)
		}
	}
	return dst
}

// maxLeafConf is T_c, the tree's cumulative confidence: the largest C of
// a branch still open. 0 when none is.
func (t *tree) maxLeafConf() float64 {
	best := 0.0
	for i := range t.nodes {
		if n := &t.nodes[i]; !n.expanded && !n.pruned {
			best = math.Max(best, n.conf)
		}
	}
	return best
}

// confByDepth sets dst[d-1] to Σ C over the drafted, unpruned nodes at
// depth d and returns it (grown as needed), so a trigger can weigh each
// depth by how often the target really accepts that deep.
func (t *tree) confByDepth(dst []float64) []float64 {
	dst = dst[:0]
	for i := 1; i < len(t.nodes); i++ {
		n := &t.nodes[i]
		if n.pruned {
			continue
		}
		for len(dst) < n.depth {
			dst = append(dst, 0)
		}
		dst[n.depth-1] += n.conf
	}
	return dst
}

// sum adds xs up (Σ C over all depths, from confByDepth).
func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// path returns the nodes from the root down to n.
func (t *tree) path(n int) []int {
	var p []int
	for ; n >= 0; n = t.nodes[n].parent {
		p = append(p, n)
	}
	for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// reroot returns the subtree under n as a tree of its own (n its root),
// its confidences rescaled so the new root's is 1, and the draft rows
// renumbered by remap (nil keeps them).
func (t *tree) reroot(n int, remap []int) *tree {
	nt := &tree{}
	scale := t.nodes[n].conf
	var visit func(old, parent int)
	visit = func(old, parent int) {
		o := t.nodes[old]
		c := node{tok: o.tok, parent: parent, prob: o.prob, row: o.row, expanded: o.expanded, pruned: o.pruned, alts: o.alts}
		if parent < 0 {
			c.prob, c.conf, c.pruned = 1, 1, false
		} else {
			c.depth = nt.nodes[parent].depth + 1
			if scale > 0 {
				c.conf = o.conf / scale
			}
		}
		if remap != nil && c.row >= 0 {
			c.row = remap[c.row]
		}
		nt.nodes = append(nt.nodes, c)
		me := len(nt.nodes) - 1
		if parent >= 0 {
			nt.nodes[parent].children = append(nt.nodes[parent].children, me)
		}
		for _, ch := range o.children {
			visit(ch, me)
		}
	}
	visit(n, -1)
	return nt
}
