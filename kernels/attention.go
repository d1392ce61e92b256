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
	mustAttention(len(out), len(q), heads, len(k), len(v), stride, off, prefix, extra, len(scores))
	backend.attention(out, q, k, v, heads, stride, off, prefix, extra, scale, scores)
}

// AttentionF16 is Attention over an F16 KV cache (IEEE half bits).
func AttentionF16(out, q []float32, k, v []uint16, heads, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	mustAttention(len(out), len(q), heads, len(k), len(v), stride, off, prefix, extra, len(scores))
	backend.attentionF16(out, q, k, v, heads, stride, off, prefix, extra, scale, scores)
}

// mustAttention checks every row the kernels will touch, so the C
// kernels never read out of bounds.
func mustAttention(nOut, nq, heads, nk, nv, stride, off, prefix int, extra []int32, nScores int) {
	fail := func(format string, a ...any) {
		panic(fmt.Sprintf("kernels: attention: "+format, a...))
	}
	if heads <= 0 || nq == 0 || nq%heads != 0 {
		fail("%d query values are not %d heads", nq, heads)
	}
	hd := nq / heads
	switch {
	case nOut < nq:
		fail("output %d, need %d", nOut, nq)
	case prefix < 0 || off < 0 || stride < 0:
		fail("prefix %d, offset %d, stride %d must not be negative", prefix, off, stride)
	case prefix+len(extra) == 0:
		fail("no KV rows to attend to")
	case nScores < heads*(prefix+len(extra)):
		fail("scores holds %d, need %d", nScores, heads*(prefix+len(extra)))
	}
	maxRow := prefix - 1
	for _, r := range extra {
		if r < 0 {
			fail("negative KV row %d", r)
		}
		maxRow = max(maxRow, int(r))
	}
	if end := maxRow*stride + off + hd; end > nk || end > nv {
		fail("KV row %d ends at %d, beyond K (%d) or V (%d)", maxRow, end, nk, nv)
	}
}

// goAttention reads each K and V row once for all heads (rows outer,
// heads inner); per head the order of operations is a lone head's.
func goAttention(out, q, k, v []float32, heads, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	hd := len(q) / heads
	n := prefix + len(extra)
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		kr := k[row*stride+off : row*stride+off+hd]
		for h := range heads {
			scores[h*n+i] = dot(q[h*hd:(h+1)*hd], kr) * scale
		}
	}
	for h := range heads {
		Softmax(scores[h*n : (h+1)*n])
	}
	clear(out[:heads*hd])
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		vr := v[row*stride+off : row*stride+off+hd]
		for h := range heads {
			p, o := scores[h*n+i], out[h*hd:(h+1)*hd]
			for d := range o {
				o[d] += p * vr[d]
			}
		}
	}
}

func goAttentionF16(out, q []float32, k, v []uint16, heads, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	hd := len(q) / heads
	n := prefix + len(extra)
	t := f16Table()
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		kr := k[row*stride+off : row*stride+off+hd]
		for h := range heads {
			qh := q[h*hd : (h+1)*hd]
			var s float32
			for d, x := range kr {
				s += qh[d] * t[x]
			}
			scores[h*n+i] = s * scale
		}
	}
	for h := range heads {
		Softmax(scores[h*n : (h+1)*n])
	}
	clear(out[:heads*hd])
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		vr := v[row*stride+off : row*stride+off+hd]
		for h := range heads {
			p, o := scores[h*n+i], out[h*hd:(h+1)*hd]
			for d, x := range vr {
				o[d] += p * t[x]
			}
		}
	}
}

func kvRow(i, prefix int, extra []int32) int {
	if i < prefix {
		return i
	}
	return int(extra[i-prefix])
}
