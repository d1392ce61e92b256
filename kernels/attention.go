package kernels

import "fmt"

// Attention computes one query head: out = Σ_i softmax_i(scale·q·K_i)·V_i
// over KV rows 0..prefix-1 followed by the rows listed in extra (a
// slot's tree ancestors and itself). Row i of K and V starts at
// i*stride+off and is len(q) long. scores is scratch of at least
// prefix+len(extra) values. Arguments out of range panic (they are
// programming errors in the caller, never input data).
func Attention(out, q, k, v []float32, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	mustAttention(len(out), len(q), len(k), len(v), stride, off, prefix, extra, len(scores))
	backend.attention(out, q, k, v, stride, off, prefix, extra, scale, scores)
}

// AttentionF16 is Attention over an F16 KV cache (IEEE half bits).
func AttentionF16(out, q []float32, k, v []uint16, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	mustAttention(len(out), len(q), len(k), len(v), stride, off, prefix, extra, len(scores))
	backend.attentionF16(out, q, k, v, stride, off, prefix, extra, scale, scores)
}

// mustAttention checks every row the kernels will touch, so the C
// kernels never read out of bounds.
func mustAttention(nOut, hd, nk, nv, stride, off, prefix int, extra []int32, nScores int) {
	fail := func(format string, a ...any) {
		panic(fmt.Sprintf("kernels: attention: "+format, a...))
	}
	switch {
	case hd == 0 || nOut < hd:
		fail("head dimension %d, output %d", hd, nOut)
	case prefix < 0 || off < 0 || stride < 0:
		fail("prefix %d, offset %d, stride %d must not be negative", prefix, off, stride)
	case prefix+len(extra) == 0:
		fail("no KV rows to attend to")
	case nScores < prefix+len(extra):
		fail("scores holds %d, need %d", nScores, prefix+len(extra))
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

func goAttention(out, q, k, v []float32, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	hd := len(q)
	n := prefix + len(extra)
	scores = scores[:n]
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		scores[i] = dot(q, k[row*stride+off:row*stride+off+hd]) * scale
	}
	Softmax(scores)
	clear(out[:hd])
	for i, p := range scores {
		row := kvRow(i, prefix, extra)
		vr := v[row*stride+off : row*stride+off+hd]
		for d := range out[:hd] {
			out[d] += p * vr[d]
		}
	}
}

func goAttentionF16(out, q []float32, k, v []uint16, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
	hd := len(q)
	n := prefix + len(extra)
	scores = scores[:n]
	t := f16Table()
	for i := 0; i < n; i++ {
		row := kvRow(i, prefix, extra)
		kr := k[row*stride+off : row*stride+off+hd]
		var s float32
		for d, h := range kr {
			s += q[d] * t[h]
		}
		scores[i] = s * scale
	}
	Softmax(scores)
	clear(out[:hd])
	for i, p := range scores {
		row := kvRow(i, prefix, extra)
		vr := v[row*stride+off : row*stride+off+hd]
		for d, h := range vr {
			out[d] += p * t[h]
		}
	}
}

func kvRow(i, prefix int, extra []int32) int {
	if i < prefix {
		return i
	}
	return int(extra[i-prefix])
}
