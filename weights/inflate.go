package weights

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
)

// InflateOptions describes the large model Inflate writes.
type InflateOptions struct {
	// Shape is the large shape. Its Vocab is replaced by the source's
	// (the function, and so the vocabulary, is the source's); Context 0
	// keeps the source's context length.
	Shape Shape
	Type  DType // matrix type (F32, F16, BF16, Q8_0, Q4_0)
	// Tokenizer holds tokenizer.ggml.* keys to embed (a llama2.c source
	// carries none); a GGUF source's own keys are kept otherwise.
	Tokenizer *Metadata
	// Progress is called with bytes written and the total.
	Progress func(done, total uint64)
}

// ErrInflateShape reports a large shape the source cannot be embedded in.
var ErrInflateShape = errors.New("cannot inflate into this shape")

// srcModel is what Inflate needs of the source model.
type srcModel struct {
	Shape
	eps, theta float32
	tied       bool
}

// readSource reads a llama-architecture file's hyperparameters and checks
// the tensors Inflate reads against them.
func readSource(f *File) (srcModel, error) {
	var s srcModel
	if arch := f.Architecture(); arch != "llama" {
		return s, fmt.Errorf("inflate: %s: architecture %q is not supported; the source must be a llama model", f.Path, arch)
	}
	get := func(key string, dst *int) error {
		v, ok := f.Metadata.Uint(key)
		if !ok || v == 0 || v > 1<<24 {
			return fmt.Errorf("inflate: %s: metadata %s is missing or outside 1..%d", f.Path, key, 1<<24)
		}
		*dst = int(v)
		return nil
	}
	for _, p := range []struct {
		key string
		dst *int
	}{
		{"llama.embedding_length", &s.Dim},
		{"llama.feed_forward_length", &s.Hidden},
		{"llama.block_count", &s.Layers},
		{"llama.attention.head_count", &s.Heads},
		{"llama.context_length", &s.Context},
	} {
		if err := get(p.key, p.dst); err != nil {
			return s, err
		}
	}
	s.KVHeads = s.Heads
	if _, ok := f.Metadata.Get("llama.attention.head_count_kv"); ok {
		if err := get("llama.attention.head_count_kv", &s.KVHeads); err != nil {
			return s, err
		}
	}
	s.eps, s.theta = 1e-5, 10000
	if v, ok := f.Metadata.Float("llama.attention.layer_norm_rms_epsilon"); ok {
		s.eps = float32(v)
	}
	if v, ok := f.Metadata.Float("llama.rope.freq_base"); ok {
		s.theta = float32(v)
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Shape) != 2 {
		return s, fmt.Errorf("inflate: %s: tensor token_embd.weight is missing or not a matrix", f.Path)
	}
	s.Vocab = int(emb.Shape[1])
	s.Name = strings.TrimSuffix(filepath.Base(f.Path), filepath.Ext(f.Path))
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("inflate: %s: %w", f.Path, err)
	}
	if v, ok := f.Metadata.Uint("llama.rope.dimension_count"); ok && int(v) != s.Dim/s.Heads {
		return s, fmt.Errorf("inflate: %s: partial RoPE (%d of %d head dims) is not supported", f.Path, v, s.Dim/s.Heads)
	}
	_, hasOut := f.Tensor("output.weight")
	s.tied = !hasOut
	// Every tensor read must have the shape the hyperparameters imply.
	for _, t := range s.Tensors(F32) {
		if t.Name == "output.weight" && s.tied {
			continue
		}
		st, err := f.TensorShaped(t.Name, t.Shape...)
		if err != nil {
			return s, fmt.Errorf("inflate: %w", err)
		}
		if !st.Type.Computable() {
			return s, fmt.Errorf("inflate: %s: tensor %s has type %s, which tandem cannot dequantize", f.Path, t.Name, st.Type)
		}
		if st.Data == nil {
			return s, fmt.Errorf("inflate: %s: tensor %s has no data (open the file with weights.Open)", f.Path, t.Name)
		}
	}
	return s, nil
}

// inflateMaps say, for each row or column index of a large matrix, which
// index of the source it holds (-1: zero). The residual stream and the
// FFN units keep their indices; attention rows follow the head layout.
type inflateMaps struct {
	resid, hidden []int32 // D, F
	q             []int32 // D: rows of W_q, columns of W_o
	kv            []int32 // KVDim: rows of W_k and W_v
	qScale        float32 // sqrt(HD/hd): 1/sqrt(head_dim) changed with head_dim
	normScale     float32 // sqrt(d/D)
}

// namedShapesFor says which of Shapes src inflates into: the shape
// lists name them all, and a source fits only some.
func namedShapesFor(src Shape) string {
	var fit []string
	for _, n := range ShapeNames() {
		if _, err := planInflate(src, Shapes[n]); err == nil {
			fit = append(fit, n)
		}
	}
	if len(fit) == 0 {
		return "it fits none of the named shapes; give dims"
	}
	return "the named shapes it fits: " + strings.Join(fit, ", ")
}

// planInflate places the source's heads in the large shape.
//
// RoPE rotates pair p of a head (elements 2p, 2p+1) by pos·θ^(-2p/hd), so
// source pair p must land on the large pair whose frequency is equal:
// p·HD/hd, which needs HD to be a multiple of hd. Source query head s
// reads KV head s/gs (gs = h/kh); in the large model head b reads KV head
// b/G. Each source KV head gets m = ceil(gs/G) large KV heads (holding
// copies of it when G < gs), and its query heads fill their groups.
func planInflate(src, big Shape) (inflateMaps, error) {
	var mp inflateMaps
	hd, HD := src.Dim/src.Heads, big.Dim/big.Heads
	gs, G := src.Heads/src.KVHeads, big.Heads/big.KVHeads
	m := (gs + G - 1) / G
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %s: %s", ErrInflateShape, big.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case big.Dim < src.Dim:
		return mp, bad("width %d is below the source's %d", big.Dim, src.Dim)
	case big.Hidden < src.Hidden:
		return mp, bad("feed-forward length %d is below the source's %d", big.Hidden, src.Hidden)
	case big.Layers < src.Layers:
		return mp, bad("%d layers are fewer than the source's %d", big.Layers, src.Layers)
	case HD%hd != 0:
		return mp, bad("head dim %d is not a multiple of the source's %d (RoPE pair p must land on pair p·%d/%d)", HD, hd, HD, hd)
	case src.KVHeads*m > big.KVHeads:
		return mp, bad("%d KV heads cannot host the source's %d KV heads with %d query heads each (%d needed)", big.KVHeads, src.KVHeads, gs, src.KVHeads*m)
	}
	k := HD / hd
	// elem maps a source head element to the large head's.
	elem := func(e int) int { return e/2*2*k + e%2 }
	fill := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = -1
		}
		return s
	}
	mp.resid, mp.hidden = fill(big.Dim), fill(big.Hidden)
	for i := 0; i < src.Dim; i++ {
		mp.resid[i] = int32(i)
	}
	for i := 0; i < src.Hidden; i++ {
		mp.hidden[i] = int32(i)
	}
	mp.q, mp.kv = fill(big.Dim), fill(big.KVDim())
	for s := 0; s < src.Heads; s++ {
		c, r := s/gs, s%gs
		kvb := c*m + r/G // large KV head of this query head
		b := kvb*G + r%G
		for e := 0; e < hd; e++ {
			mp.q[b*HD+elem(e)] = int32(s*hd + e)
			mp.kv[kvb*HD+elem(e)] = int32(c*hd + e)
		}
	}
	mp.qScale = float32(math.Sqrt(float64(HD) / float64(hd)))
	mp.normScale = float32(math.Sqrt(float64(src.Dim) / float64(big.Dim)))
	return mp, nil
}

// InflatePlan returns the metadata and tensors Inflate writes for src.
func InflatePlan(src *File, opt InflateOptions) (*Metadata, []TensorInfo, error) {
	s, err := readSource(src)
	if err != nil {
		return nil, nil, err
	}
	_, _, md, infos, err := inflatePlan(src, s, opt)
	return md, infos, err
}

func inflatePlan(src *File, s srcModel, opt InflateOptions) (Shape, inflateMaps, *Metadata, []TensorInfo, error) {
	if _, ok := FileTypeFor(opt.Type); !ok || !canQuantize(opt.Type) {
		return Shape{}, inflateMaps{}, nil, nil, fmt.Errorf("inflate: cannot write %s weights (choose f32, f16, bf16, q8_0 or q4_0)", opt.Type)
	}
	big := opt.Shape
	big.Vocab = s.Vocab
	if big.Context == 0 {
		big.Context = s.Context
	}
	if err := big.Validate(); err != nil {
		return big, inflateMaps{}, nil, nil, fmt.Errorf("inflate: %w", err)
	}
	mp, err := planInflate(s.Shape, big)
	if err != nil {
		return big, mp, nil, nil, fmt.Errorf("inflate: %s: %w (%s)", src.Path, err, namedShapesFor(s.Shape))
	}
	md := big.Metadata(s.Name+" inflated to "+big.Name, opt.Type)
	// RMSNorm over D' dims of which D are the source's: mean square and
	// epsilon both shrink by D/D', the weights absorb the sqrt.
	md.Set("llama.attention.layer_norm_rms_epsilon", Float32Value(s.eps*float32(s.Dim)/float32(big.Dim)))
	md.Set("llama.rope.freq_base", Float32Value(s.theta))
	md.Set("general.description", StringValue(fmt.Sprintf("tandem inflate: %s (dim %d, %d layers) embedded in %s with zero padding; greedy output equals the source's",
		s.Name, s.Dim, s.Layers, big.Name)))
	for _, kv := range src.Metadata.All() {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			md.Set(kv.Key, kv.Value)
		}
	}
	if opt.Tokenizer != nil {
		for _, kv := range opt.Tokenizer.All() {
			md.Set(kv.Key, kv.Value)
		}
	}
	if toks, err := md.Strings("tokenizer.ggml.tokens"); err == nil && len(toks) != s.Vocab {
		return big, mp, nil, nil, fmt.Errorf("inflate: the tokenizer has %d tokens but %s's vocabulary is %d: they do not belong together", len(toks), src.Path, s.Vocab)
	}
	return big, mp, md, big.Tensors(opt.Type), nil
}

// inflateRule says how one large tensor is built: from which source tensor,
// through which row and column maps, times which scale.
type inflateRule struct {
	src        string // "" = all zero
	rows, cols []int32
	scale      float32
}

func (s srcModel) rule(mp inflateMaps, name string) inflateRule {
	vocab := make([]int32, s.Vocab)
	for i := range vocab {
		vocab[i] = int32(i)
	}
	switch name {
	case "token_embd.weight":
		return inflateRule{name, vocab, mp.resid, 1}
	case "output.weight":
		if s.tied {
			return inflateRule{"token_embd.weight", vocab, mp.resid, 1}
		}
		return inflateRule{name, vocab, mp.resid, 1}
	case "output_norm.weight":
		return inflateRule{name, []int32{0}, mp.resid, mp.normScale}
	}
	var l int
	if _, err := fmt.Sscanf(name, "blk.%d.", &l); err != nil {
		return inflateRule{}
	}
	kind := strings.TrimSuffix(strings.TrimPrefix(name, fmt.Sprintf("blk.%d.", l)), ".weight")
	if l >= s.Layers {
		return inflateRule{} // an extra layer: zero, the residual passes through
	}
	switch kind {
	case "attn_norm", "ffn_norm":
		return inflateRule{name, []int32{0}, mp.resid, mp.normScale}
	case "attn_q":
		return inflateRule{name, mp.q, mp.resid, mp.qScale}
	case "attn_k", "attn_v":
		return inflateRule{name, mp.kv, mp.resid, 1}
	case "attn_output":
		return inflateRule{name, mp.resid, mp.q, 1}
	case "ffn_gate", "ffn_up":
		return inflateRule{name, mp.hidden, mp.resid, 1}
	case "ffn_down":
		return inflateRule{name, mp.resid, mp.hidden, 1}
	}
	return inflateRule{}
}

// Inflate writes to path a model of opt.Shape whose function equals
// src's: src's weights embedded with zero padding (extra heads, FFN units
// and whole layers contribute nothing to the residual stream), the
// attention scale ratio folded into W_q, RoPE pairs placed at equal
// frequencies, RMSNorm weights scaled by sqrt(D/D') and epsilon by D/D'.
// Its greedy output is src's while its bytes and FLOPs are the large
// shape's. Rows are built and quantized one at a time and streamed to
// disk (an all-zero row is quantized once), so memory stays at a few
// rows whatever the size.
func Inflate(src *File, path string, opt InflateOptions) error {
	s, err := readSource(src)
	if err != nil {
		return err
	}
	_, mp, md, infos, err := inflatePlan(src, s, opt)
	if err != nil {
		return err
	}
	var total, done uint64
	for _, t := range infos {
		n, err := t.Bytes()
		if err != nil {
			return fmt.Errorf("inflate: %w", err)
		}
		total += n
	}
	zeroRows := map[DType][]byte{} // one quantized zero row per (type, length)
	var srcRow, row []float32
	var out []byte
	return WriteGGUF(path, md, infos, func(i int, w io.Writer) error {
		t := infos[i]
		cols := int(t.Shape[0])
		rows := 1
		if len(t.Shape) > 1 {
			rows = int(t.Shape[1])
		}
		rowBytes, _ := t.Type.RowBytes(uint64(cols))
		zero := zeroRows[t.Type]
		if len(zero) != int(rowBytes) {
			zero = make([]byte, rowBytes)
			if err := Quantize(t.Type, make([]float32, cols), zero); err != nil {
				return err
			}
			zeroRows[t.Type] = zero
		}
		r := s.rule(mp, t.Name)
		var st *Tensor
		var stRow uint64
		if r.src != "" {
			st, _ = src.Tensor(r.src)
			stRow, _ = st.Type.RowBytes(st.Shape[0])
		}
		row = grow(row, cols)
		out = grow(out, int(rowBytes))
		for j := 0; j < rows; j++ {
			sr := int32(-1)
			if st != nil {
				sr = r.rows[j]
			}
			if sr < 0 {
				if _, err := w.Write(zero); err != nil {
					return err
				}
			} else {
				srcRow = grow(srcRow, int(st.Shape[0]))
				if err := Dequantize(st.Type, st.Data[uint64(sr)*stRow:uint64(sr+1)*stRow], srcRow); err != nil {
					return fmt.Errorf("source %s row %d: %w", st.Name, sr, err)
				}
				for c, sc := range r.cols {
					row[c] = 0
					if sc >= 0 {
						row[c] = srcRow[sc] * r.scale
					}
				}
				if err := Quantize(t.Type, row, out); err != nil {
					return fmt.Errorf("row %d: %w", j, err)
				}
				if _, err := w.Write(out); err != nil {
					return err
				}
			}
			done += rowBytes
			if opt.Progress != nil && (j%256 == 255 || j == rows-1) {
				opt.Progress(done, total)
			}
		}
		return nil
	})
}
