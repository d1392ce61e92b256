package kernels

import "fmt"

// Attention computes heads query heads that share one KV head (grouped-
// query attention): for each head h, out_h = Σ_i softmax_i(scale·q_h·K_i)·V_i
// over KV rows 0..prefix-1 followed by the rows listed in extra (a
// slot's tree ancestors and itself). q and out hold the heads one after
// another, hd = len(q)/heads values each; row i of K and V starts at
// i*stride+off and is hd long. scores is scratch of at least
// heads·(prefix+len(extra)) values. The heads are computed together so
// each K and V row is read once for all of them, not once per head; each
// head's arithmetic is that of attending it alone (the same bits).
// Arguments out of range panic (they are programming errors in the
// caller, never input data).
func Attention(out, q, k, v []float32, heads, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	n := prefix + len(extra)
	mustAttention(len(out), len(q), heads, 1, 0, len(k), len(v), stride, off, prefix, extra, nil, nil, n, len(scores))
	backend.attention(out, q, k, v, heads, 1, 0, stride, off, prefix, extra, nil, nil, n, scale, scores)
}

// AttentionF16 is Attention over an F16 KV cache (IEEE half bits).
func AttentionF16(out, q []float32, k, v []uint16, heads, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	n := prefix + len(extra)
	mustAttention(len(out), len(q), heads, 1, 0, len(k), len(v), stride, off, prefix, extra, nil, nil, n, len(scores))
	backend.attentionF16(out, q, k, v, heads, 1, 0, stride, off, prefix, extra, nil, nil, n, scale, scores)
}

// AttentionTree is Attention for groups groups of heads query heads that
// share one KV head and the rows 0..prefix-1, as the slots of one
// sequence's token tree (or prefill chain) do: group g's queries start at
// q[g*qs] and its output at out[g*qs], and after the prefix it attends to
// anc[lo[g]:hi[g]]. q and out end with the last group's heads, so hd =
// (len(q) − (groups−1)·qs)/heads. scores is scratch of at least
// groups·heads·(prefix + the longest anc range). The prefix's K and V
// rows are read once for every group, not once per group, and each
// group's bits are those Attention gives it alone.
func AttentionTree(out, q, k, v []float32, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, scale float32, scores []float32) {
	ld := treeWidth(prefix, lo, hi)
	mustAttention(len(out), len(q), heads, groups, qs, len(k), len(v), stride, off, prefix, anc, lo, hi, ld, len(scores))
	backend.attention(out, q, k, v, heads, groups, qs, stride, off, prefix, anc, lo, hi, ld, scale, scores)
}

// AttentionTreeF16 is AttentionTree over an F16 KV cache.
func AttentionTreeF16(out, q []float32, k, v []uint16, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, scale float32, scores []float32) {
	ld := treeWidth(prefix, lo, hi)
	mustAttention(len(out), len(q), heads, groups, qs, len(k), len(v), stride, off, prefix, anc, lo, hi, ld, len(scores))
	backend.attentionF16(out, q, k, v, heads, groups, qs, stride, off, prefix, anc, lo, hi, ld, scale, scores)
}

// treeWidth is the most rows a group of AttentionTree reads: the scores
// buffer's row length.
func treeWidth(prefix int, lo, hi []int) int {
	most := 0
	for g := range min(len(lo), len(hi)) {
		most = max(most, hi[g]-lo[g])
	}
	return prefix + most
}

// mustAttention checks every row the kernels will touch, so the C
// kernels never read out of bounds. lo and hi are nil for one group
// reading all of anc; ld is the scores' row length.
func mustAttention(nOut, nq, heads, groups, qs, nk, nv, stride, off, prefix int, anc []int32, lo, hi []int, ld, nScores int) {
	fail := func(format string, a ...any) {
		panic(fmt.Sprintf("kernels: attention: "+format, a...))
	}
	// Without ranges one group reads all of anc; several groups each
	// need theirs (the scores' rows are as long as the longest range).
	ranges := lo != nil || hi != nil
	if groups <= 0 || !ranges && groups != 1 || ranges && (len(lo) != groups || len(hi) != groups) {
		fail("%d groups with %d and %d row ranges", groups, len(lo), len(hi))
	}
	last := (groups - 1) * qs
	if heads <= 0 || qs < 0 || nq <= last || (nq-last)%heads != 0 {
		fail("%d query values are not %d groups of %d heads, %d apart", nq, groups, heads, qs)
	}
	hd := (nq - last) / heads
	switch {
	case groups > 1 && qs < heads*hd:
		fail("groups %d apart overlap their %d heads of %d", qs, heads, hd)
	case nOut < nq:
		fail("output %d, need %d", nOut, nq)
	case prefix < 0 || off < 0 || stride < 0:
		fail("prefix %d, offset %d, stride %d must not be negative", prefix, off, stride)
	case nScores < groups*heads*ld:
		fail("scores holds %d, need %d", nScores, groups*heads*ld)
	}
	for g := range len(lo) {
		switch {
		case lo[g] < 0 || hi[g] < lo[g] || hi[g] > len(anc):
			fail("group %d reads anc[%d:%d] of %d", g, lo[g], hi[g], len(anc))
		case prefix+hi[g]-lo[g] == 0:
			fail("group %d attends to no KV rows", g)
		}
	}
	if lo == nil && prefix+len(anc) == 0 {
		fail("no KV rows to attend to")
	}
	maxRow := prefix - 1
	for _, r := range anc {
		if r < 0 {
			fail("negative KV row %d", r)
		}
		maxRow = max(maxRow, int(r))
	}
	if end := maxRow*stride + off + hd; end > nk || end > nv {
		fail("KV row %d ends at %d, beyond K (%d) or V (%d)", maxRow, end, nk, nv)
	}
}

// rowRange is group g's rows of anc: all of it when lo is nil.
func rowRange(anc []int32, lo, hi []int, g int) []int32 {
	if lo == nil {
		return anc
	}
	return anc[lo[g]:hi[g]]
}

// goAttention reads each K and V row of the prefix once for every group
// and head (rows outer), then each group's own rows; per head the order
// of operations is a lone head's.
func goAttention(out, q, k, v []float32, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32) {
	hd := (len(q) - (groups-1)*qs) / heads
	score := func(g, i int, kr []float32) {
		for h := range heads {
			scores[(g*heads+h)*ld+i] = dot(q[g*qs+h*hd:g*qs+(h+1)*hd], kr) * scale
		}
	}
	add := func(g, i int, vr []float32) {
		for h := range heads {
			o, p := out[g*qs+h*hd:g*qs+(h+1)*hd], scores[(g*heads+h)*ld+i]
			for d := range o {
				o[d] += p * vr[d]
			}
		}
	}
	for i := range prefix {
		for g := range groups {
			score(g, i, k[i*stride+off:i*stride+off+hd])
		}
	}
	for g := range groups {
		own := rowRange(anc, lo, hi, g)
		for j, r := range own {
			score(g, prefix+j, k[int(r)*stride+off:int(r)*stride+off+hd])
		}
		softmaxHeads(scores[g*heads*ld:], heads, ld, prefix+len(own))
		clear(out[g*qs : g*qs+heads*hd])
	}
	for i := range prefix {
		for g := range groups {
			add(g, i, v[i*stride+off:i*stride+off+hd])
		}
	}
	for g := range groups {
		for j, r := range rowRange(anc, lo, hi, g) {
			add(g, prefix+j, v[int(r)*stride+off:int(r)*stride+off+hd])
		}
	}
}

// goAttentionF16 is goAttention over half rows. It is a copy with the
// rows read through f16Table: rows widened into a buffer first, shared
// with goAttention, put the buffer on the heap on every call.
func goAttentionF16(out, q []float32, k, v []uint16, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32) {
	hd := (len(q) - (groups-1)*qs) / heads
	t := f16Table()
	score := func(g, i int, kr []uint16) {
		for h := range heads {
			qh := q[g*qs+h*hd : g*qs+(h+1)*hd]
			var s float32
			for d, x := range kr {
				s += qh[d] * t[x]
			}
			scores[(g*heads+h)*ld+i] = s * scale
		}
	}
	add := func(g, i int, vr []uint16) {
		for h := range heads {
			o, p := out[g*qs+h*hd:g*qs+(h+1)*hd], scores[(g*heads+h)*ld+i]
			for d, x := range vr {
				o[d] += p * t[x]
			}
		}
	}
	for i := range prefix {
		for g := range groups {
			score(g, i, k[i*stride+off:i*stride+off+hd])
		}
	}
	for g := range groups {
		own := rowRange(anc, lo, hi, g)
		for j, r := range own {
			score(g, prefix+j, k[int(r)*stride+off:int(r)*stride+off+hd])
		}
		softmaxHeads(scores[g*heads*ld:], heads, ld, prefix+len(own))
		clear(out[g*qs : g*qs+heads*hd])
	}
	for i := range prefix {
		for g := range groups {
			add(g, i, v[i*stride+off:i*stride+off+hd])
		}
	}
	for g := range groups {
		for j, r := range rowRange(anc, lo, hi, g) {
			add(g, prefix+j, v[int(r)*stride+off:int(r)*stride+off+hd])
		}
	}
}

// softmaxHeads applies Softmax to the first n scores of each of heads
// rows ld apart.
func softmaxHeads(scores []float32, heads, ld, n int) {
	for h := range heads {
		Softmax(scores[h*ld : h*ld+n])
	}
}
