package kernels

// Attention computes one query head: out = Σ_i softmax_i(scale·q·K_i)·V_i
// over KV rows 0..prefix-1 followed by the rows listed in extra (a
// slot's tree ancestors and itself). Row i of K and V starts at
// i*stride+off and is len(q) long. scores is scratch of at least
// prefix+len(extra) values.
func Attention(out, q, k, v []float32, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
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

// AttentionF16 is Attention over an F16 KV cache (IEEE half bits).
func AttentionF16(out, q []float32, k, v []uint16, stride, off, prefix int, extra []int32, scale float32, scores []float32) {
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
