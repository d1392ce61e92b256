//go:build cuda

package cuda

import (
	"fmt"

	"gorgonia.org/cu"

	"github.com/tandem-llm/tandem/weights"
)

// The launches of the .cu kernels. Each checks its arguments against the
// buffers' sizes (so a kernel never reads or writes outside them), queues
// the kernel on the compute stream and returns without waiting. Vector
// batches are laid out as in package kernels: n vectors one after another.

const threads = 128 // per block: four warps

// MatMulTypes are the weight types MatMul has kernels for.
var MatMulTypes = []weights.DType{weights.F32, weights.F16, weights.BF16, weights.Q8_0, weights.Q4_0}

// UploadWeights copies a matrix of rows rows of cols weights of type wt,
// raw in GGUF layout, into dst in the layout the kernels read: Q8_0 and
// Q4_0 blocks are split into all quants, then all scales (see
// matmul.cu), other types are copied as they are. It waits for the copy.
func (s *Stream) UploadWeights(dst Buffer, raw []byte, wt weights.DType, rows, cols int) error {
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		return fmt.Errorf("cuda: weights: %w", err)
	}
	if uint64(len(raw)) != rb*uint64(rows) || int64(len(raw)) > dst.size {
		return fmt.Errorf("cuda: weights: %d bytes for %d rows of %d %s (%d expected) into a %d-byte buffer", len(raw), rows, cols, wt, rb*uint64(rows), dst.size)
	}
	if wt != weights.Q8_0 && wt != weights.Q4_0 {
		if err := s.Upload(dst, raw); err != nil {
			return err
		}
		return s.Sync()
	}
	tmp, err := s.d.Alloc(int64(len(raw)))
	if err != nil {
		return err
	}
	defer s.d.Free(tmp)
	nblocks := int64(len(raw) / wt.TypeSize())
	if err := s.Upload(tmp, raw); err != nil {
		return err
	}
	if err := s.launch("repack_q", [3]int{blocks(int(nblocks), 256), 1, 1}, 256, 0, dst, tmp, nblocks, wt.TypeSize()); err != nil {
		return err
	}
	return s.Sync() // before tmp is freed
}

// MatMul computes out[j*rows+r] = Σ_c W[r][c]·x[j*cols+c] for the n
// float32 vectors in x, as kernels.Pool.MatMul does: w holds rows rows of
// cols weights of type wt as UploadWeights lays them out. Q8_0 and Q4_0
// weights multiply activations quantized to int8 blocks, as the host
// kernels do; the
// quantized form is reused by the next MatMul of the same x when nothing
// else ran in between (the Q, K and V projections of one input).
func (s *Stream) MatMul(out, w Buffer, wt weights.DType, rows, cols int, x Buffer, n int) error {
	return s.matmul(out, w, wt, rows, cols, x, n, false)
}

// MatMulAdd is MatMul adding the product into out: the projection and the
// residual connection after it in one kernel, with the same roundings.
func (s *Stream) MatMulAdd(out, w Buffer, wt weights.DType, rows, cols int, x Buffer, n int) error {
	return s.matmul(out, w, wt, rows, cols, x, n, true)
}

func (s *Stream) matmul(out, w Buffer, wt weights.DType, rows, cols int, x Buffer, n int, add bool) error {
	if s.err != nil {
		return s.err
	}
	name, err := matmulKernel(wt)
	if err != nil {
		return err
	}
	if rows <= 0 || cols <= 0 || n <= 0 {
		return fmt.Errorf("cuda: matmul: rows %d, cols %d, n %d must be positive", rows, cols, n)
	}
	if cols%wt.BlockSize() != 0 {
		return fmt.Errorf("cuda: matmul: %d columns is not a multiple of the %s block size %d", cols, wt, wt.BlockSize())
	}
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	switch {
	case uint64(w.size) < rb*uint64(rows):
		return fmt.Errorf("cuda: matmul: weights hold %d bytes, %d rows of %d %s need %d", w.size, rows, cols, wt, rb*uint64(rows))
	case x.size < int64(n)*int64(cols)*4:
		return fmt.Errorf("cuda: matmul: activations hold %d bytes, %d vectors of %d need %d", x.size, n, cols, int64(n)*int64(cols)*4)
	case out.size < int64(n)*int64(rows)*4:
		return fmt.Errorf("cuda: matmul: output holds %d bytes, %d vectors of %d rows need %d", out.size, n, rows, int64(n)*int64(rows)*4)
	}
	nc := 8
	if n == 1 {
		nc = 1
	}
	name = fmt.Sprintf("%s_%d", name, nc)
	grid := [3]int{blocks(rows, threads/32), blocks(n, nc), 1}
	defer func() {
		if overlaps(out, s.quantOf) {
			s.quantOf = Buffer{} // the quantized input is stale now
		}
	}()
	if wt != weights.Q8_0 && wt != weights.Q4_0 {
		return s.launch(name, grid, threads, 0, out, w, x, rows, cols, n, add)
	}
	// Quantized activations: n*cols int8, a float scale per 32 and an
	// int32 sum per 16, in one scratch buffer.
	vals := int64(n) * int64(cols)
	scratch, err := s.scratchBuf(MatMulScratch(n, cols))
	if err != nil {
		return err
	}
	q := scratch.Slice(0, vals)
	d := scratch.Slice(vals, vals/32*4)
	sums := scratch.Slice(vals+vals/32*4, vals/16*4)
	nb := int(vals / 32)
	if s.quantOf != x.Slice(0, vals*4) {
		if err := s.launch("quantize_q8", [3]int{blocks(nb, threads/32), 1, 1}, threads, 0, x, q, d, sums, nb); err != nil {
			return err
		}
		s.quantOf = x.Slice(0, vals*4)
	}
	return s.launch(name, grid, threads, 0, out, w, q, d, sums, rows, cols, n, add)
}

func overlaps(a, b Buffer) bool {
	return a.size > 0 && b.size > 0 && a.ptr < b.ptr+cu.DevicePtr(b.size) && b.ptr < a.ptr+cu.DevicePtr(a.size)
}

func matmulKernel(wt weights.DType) (string, error) {
	switch wt {
	case weights.F32:
		return "matmul_f32", nil
	case weights.F16:
		return "matmul_f16", nil
	case weights.BF16:
		return "matmul_bf16", nil
	case weights.Q8_0:
		return "matmul_q8_0", nil
	case weights.Q4_0:
		return "matmul_q4_0", nil
	}
	return "", fmt.Errorf("cuda: matmul: no GPU kernel for %s weights (GPU types: F32, F16, BF16, Q8_0, Q4_0); convert the model with tandem convert --type q8_0", wt)
}

// RMSNorm sets out[j] = rmsnorm(x[src]) · w for j < n, vectors of dim
// floats, where src = rows[j] (int32) when rows is not empty, else j.
func (s *Stream) RMSNorm(out, x, w, rows Buffer, dim, n int, eps float32) error {
	switch {
	case dim <= 0 || n <= 0:
		return fmt.Errorf("cuda: rmsnorm: dim %d and n %d must be positive", dim, n)
	case out.size < int64(n*dim)*4 || w.size < int64(dim)*4:
		return fmt.Errorf("cuda: rmsnorm: output %d or weight %d bytes too small for %d vectors of %d", out.size, w.size, n, dim)
	case rows.size == 0 && x.size < int64(n*dim)*4:
		return fmt.Errorf("cuda: rmsnorm: input holds %d bytes, %d vectors of %d need %d", x.size, n, dim, n*dim*4)
	case rows.size != 0 && rows.size < int64(n)*4:
		return fmt.Errorf("cuda: rmsnorm: %d row indices for %d vectors", rows.size/4, n)
	}
	return s.launch("rmsnorm", [3]int{n, 1, 1}, 256, 0, out, x, w, rows, dim, eps)
}

// RoPE rotates, in place, the heads of the n vectors of q (heads heads of
// headDim) and k (kvHeads heads; k may be empty) at positions pos (int32
// per vector), as kernels.RoPE does for one vector.
func (s *Stream) RoPE(q, k, pos Buffer, n, heads, kvHeads, headDim int, theta float32) error {
	switch {
	case n <= 0 || heads <= 0 || headDim <= 0 || headDim%2 != 0:
		return fmt.Errorf("cuda: rope: n %d, heads %d, head dim %d (must be even)", n, heads, headDim)
	case q.size < int64(n*heads*headDim)*4 || pos.size < int64(n)*4:
		return fmt.Errorf("cuda: rope: q (%d bytes) or positions (%d bytes) too small for %d vectors", q.size, pos.size, n)
	case k.size != 0 && k.size < int64(n*kvHeads*headDim)*4:
		return fmt.Errorf("cuda: rope: k holds %d bytes, %d vectors of %d heads need %d", k.size, n, kvHeads, n*kvHeads*headDim*4)
	}
	pairs := n * headDim / 2
	return s.launch("rope", [3]int{blocks(pairs, threads), 1, 1}, threads, 0, q, k, pos, n, heads, kvHeads, headDim, theta)
}

// SiLUMul sets gate[i] = silu(gate[i]) · up[i] for i < count.
func (s *Stream) SiLUMul(gate, up Buffer, count int) error {
	if count <= 0 || gate.size < int64(count)*4 || up.size < int64(count)*4 {
		return fmt.Errorf("cuda: silu: %d values in buffers of %d and %d bytes", count, gate.size, up.size)
	}
	return s.launch("silu_mul", [3]int{blocks(count, 256), 1, 1}, 256, 0, gate, up, int64(count))
}

// Add adds x into dst for count values.
func (s *Stream) Add(dst, x Buffer, count int) error {
	if count <= 0 || dst.size < int64(count)*4 || x.size < int64(count)*4 {
		return fmt.Errorf("cuda: add: %d values in buffers of %d and %d bytes", count, dst.size, x.size)
	}
	return s.launch("add", [3]int{blocks(count, 256), 1, 1}, 256, 0, dst, x, int64(count))
}

// EmbedTypes are the embedding table types Embed decodes.
var EmbedTypes = MatMulTypes

// Embed sets out[j] to row tokens[j] (int32) of table, vocab rows of dim
// values of type wt laid out by UploadWeights, decoded as
// weights.Dequantize does. The tokens must be rows of the table: the
// caller validated them.
func (s *Stream) Embed(out, table Buffer, wt weights.DType, vocab int, tokens Buffer, n, dim int) error {
	if _, err := matmulKernel(wt); err != nil {
		return fmt.Errorf("cuda: embedding: no GPU decoder for %s", wt)
	}
	rb, err := wt.RowBytes(uint64(dim))
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	if n <= 0 || out.size < int64(n*dim)*4 || tokens.size < int64(n)*4 || uint64(table.size) < rb*uint64(vocab) {
		return fmt.Errorf("cuda: embedding: %d tokens of %d into %d bytes from a %d-byte table of %d rows", n, dim, out.size, table.size, vocab)
	}
	return s.launch("embed", [3]int{n, 1, 1}, threads, 0, out, table, int(wt), vocab, tokens, dim)
}

// KV is the layout of a KV cache's rows on the device: per sequence,
// 2*Layers planes (K of layer l is plane 2l, V plane 2l+1) of Context
// rows of KVDim values, float32 or (F16) IEEE half.
type KV struct {
	Layers, Context, KVDim int
	F16                    bool
}

func (kv KV) elemSize() int64 {
	if kv.F16 {
		return 2
	}
	return 4
}

// SeqBytes is the device memory of one sequence.
func (kv KV) SeqBytes() int64 {
	return 2 * int64(kv.Layers) * int64(kv.Context) * int64(kv.KVDim) * kv.elemSize()
}

// planes returns the element offsets of layer's K and V planes.
func (kv KV) planes(layer int) (koff, voff int64) {
	plane := int64(kv.Context) * int64(kv.KVDim)
	return 2 * int64(layer) * plane, (2*int64(layer) + 1) * plane
}

// KVPut writes vector j of k and v (KVDim floats each) into layer's row
// rows[j] (int32) of the sequence whose rows start at address bases[j]
// (uint64 per vector), rounding to half for F16.
func (s *Stream) KVPut(kv KV, layer int, k, v, bases, rows Buffer, n int) error {
	if layer < 0 || layer >= kv.Layers || n <= 0 {
		return fmt.Errorf("cuda: kv put: layer %d of %d, n %d", layer, kv.Layers, n)
	}
	if k.size < int64(n*kv.KVDim)*4 || v.size < int64(n*kv.KVDim)*4 || bases.size < int64(n)*8 || rows.size < int64(n)*4 {
		return fmt.Errorf("cuda: kv put: buffers too small for %d vectors of %d", n, kv.KVDim)
	}
	koff, voff := kv.planes(layer)
	return s.launch("kv_put", [3]int{blocks(n*kv.KVDim, 256), 1, 1}, 256, 0, k, v, bases, rows, koff, voff, kv.KVDim, n, kv.F16)
}

// KVMove copies row src[i] to row dst[i] of every plane of the sequence
// in seq, for i in order (each copy sees the earlier ones), as
// kv.Cache.Commit compacts rows on the host.
func (s *Stream) KVMove(kv KV, seq Buffer, dst, src []int32) error {
	if len(dst) != len(src) {
		return fmt.Errorf("cuda: kv move: %d destinations, %d sources", len(dst), len(src))
	}
	if len(dst) == 0 {
		return nil
	}
	if seq.size < kv.SeqBytes() {
		return fmt.Errorf("cuda: kv move: sequence buffer holds %d bytes, needs %d", seq.size, kv.SeqBytes())
	}
	for i := range dst {
		if dst[i] < 0 || src[i] < 0 || int(dst[i]) >= kv.Context || int(src[i]) >= kv.Context {
			return fmt.Errorf("cuda: kv move %d: row %d to %d is outside the context of %d", i, src[i], dst[i], kv.Context)
		}
	}
	idx, err := s.scratchBuf(int64(8 * len(dst)))
	if err != nil {
		return err
	}
	both := make([]int32, 0, 2*len(dst))
	both = append(append(both, dst...), src...)
	if err := s.UploadInt32(idx, both); err != nil {
		return err
	}
	rowUnits := int64(kv.KVDim) * kv.elemSize() / 2
	planeUnits := rowUnits * int64(kv.Context)
	units := 2 * int64(kv.Layers) * rowUnits
	return s.launch("kv_move", [3]int{blocks(int(units), 256), 1, 1}, 256, 0, seq, 2*kv.Layers, planeUnits, int(rowUnits),
		idx.Slice(0, int64(4*len(dst))), idx.Slice(int64(4*len(dst)), int64(4*len(dst))), len(dst))
}

// KVCopy copies rows 0..n-1 of every plane of the sequence in src to the
// same rows of the sequence in dst, as kv.Cache.CopyPrefix does on the
// host: one device copy per plane, in order with the compute work.
func (s *Stream) KVCopy(kv KV, dst, src Buffer, n int) error {
	if dst.size < kv.SeqBytes() || src.size < kv.SeqBytes() {
		return fmt.Errorf("cuda: kv copy: sequence buffers hold %d and %d bytes, need %d", dst.size, src.size, kv.SeqBytes())
	}
	if n < 0 || n > kv.Context {
		return fmt.Errorf("cuda: kv copy of %d rows: outside the context of %d", n, kv.Context)
	}
	rows := int64(n) * int64(kv.KVDim) * kv.elemSize()
	plane := int64(kv.Context) * int64(kv.KVDim) * kv.elemSize()
	for p := int64(0); p < 2*int64(kv.Layers) && rows > 0; p++ {
		if err := s.Copy(dst.Slice(p*plane, rows), src.Slice(p*plane, rows)); err != nil {
			return err
		}
	}
	return nil
}

// Attention describes one layer's attention over a batch of n vectors:
// query head h of vector i attends, with KV head h/(Heads/KVHeads), to
// rows 0..Prefix[i]-1 of its sequence and then to rows Anc[Lo[i]:Hi[i]]
// (its tree ancestors and itself), as kernels.Attention does per head.
// Prefix, Anc, Lo and Hi hold int32s, Bases a uint64 sequence address per
// vector; MaxLen bounds Prefix[i]+Hi[i]-Lo[i].
type Attention struct {
	Out, Q                  Buffer
	Bases                   Buffer
	Prefix, Anc, Lo, Hi     Buffer
	N, Heads, KVHeads, Head int
	MaxLen                  int
	Scale                   float32
}

// maxHead is attention.cu's MAX_HEAD.
const maxHead = 256

// Attention runs a over layer's planes of kv.
func (s *Stream) Attention(kv KV, layer int, a *Attention) error {
	switch {
	case a.N <= 0 || a.Heads <= 0 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 || a.Head <= 0 || a.MaxLen <= 0:
		return fmt.Errorf("cuda: attention: n %d, heads %d, kv heads %d, head dim %d, max len %d", a.N, a.Heads, a.KVHeads, a.Head, a.MaxLen)
	case a.Head > maxHead:
		return fmt.Errorf("cuda: attention: head dimension %d is over the kernel's %d", a.Head, maxHead)
	case a.KVHeads*a.Head != kv.KVDim || layer < 0 || layer >= kv.Layers:
		return fmt.Errorf("cuda: attention: %d kv heads of %d do not make the cache's width %d (layer %d of %d)", a.KVHeads, a.Head, kv.KVDim, layer, kv.Layers)
	case a.Q.size < int64(a.N*a.Heads*a.Head)*4 || a.Out.size < int64(a.N*a.Heads*a.Head)*4:
		return fmt.Errorf("cuda: attention: q or out too small for %d vectors of %d heads of %d", a.N, a.Heads, a.Head)
	case a.Bases.size < int64(a.N)*8 || a.Prefix.size < int64(a.N)*4 || a.Lo.size < int64(a.N)*4 || a.Hi.size < int64(a.N)*4:
		return fmt.Errorf("cuda: attention: per-vector tables too small for %d vectors", a.N)
	}
	scores, err := s.scratchBuf(AttentionScratch(a.N, a.Heads, a.MaxLen))
	if err != nil {
		return err
	}
	name := "attention_f32"
	if kv.F16 {
		name = "attention_f16"
	}
	koff, voff := kv.planes(layer)
	const block = 256
	return s.launch(name, [3]int{a.Heads, a.N, 1}, block, (1+block/32)*a.Head*4, a.Out, a.Q, a.Bases, koff, voff, kv.KVDim,
		a.Heads, a.Heads/a.KVHeads, a.Head, a.Prefix, a.Anc, a.Lo, a.Hi, a.Scale, scores, a.MaxLen)
}
