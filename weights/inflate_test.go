package weights

import (
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestPlanInflateRoPE checks that every source head element lands exactly
// once, on a large element whose RoPE frequency (as the kernels compute
// it, in float32) equals the source's, and that each query head reads the
// large KV head holding its source KV head.
func TestPlanInflateRoPE(t *testing.T) {
	src := Shape{Name: "src", Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4, Vocab: 512, Context: 512}
	for _, big := range []Shape{
		Shapes["tinyllama-1.1b"], Shapes["stories110m"], Shapes["llama2-7b"],
		{Name: "same", Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4},
	} {
		t.Run(big.Name, func(t *testing.T) {
			mp, err := planInflate(src, big)
			if err != nil {
				t.Fatal(err)
			}
			hd, HD := src.Dim/src.Heads, big.Dim/big.Heads
			freq := func(e, headDim int) float32 {
				return float32(e-e%2) / float32(headDim)
			}
			seen := map[int32]bool{}
			for R, s := range mp.q {
				if s < 0 {
					continue
				}
				if seen[s] {
					t.Fatalf("source q row %d placed twice", s)
				}
				seen[s] = true
				if freq(int(s)%hd, hd) != freq(R%HD, HD) || int(s)%2 != R%2 {
					t.Errorf("source element %d of its head lands on element %d: RoPE exponent %v vs %v", int(s)%hd, R%HD, freq(int(s)%hd, hd), freq(R%HD, HD))
				}
				// The large KV head this query head reads holds the
				// source KV head the source query head read.
				bigKV := R / HD / (big.Heads / big.KVHeads)
				want := int32(int(s)/hd/(src.Heads/src.KVHeads)*hd + int(s)%hd)
				if got := mp.kv[bigKV*HD+R%HD]; got != want {
					t.Errorf("q row %d (source %d) reads kv row %d, want %d", R, s, got, want)
				}
			}
			if len(seen) != src.Dim {
				t.Errorf("%d of %d source q rows placed", len(seen), src.Dim)
			}
			if want := float32(math.Sqrt(float64(HD) / float64(hd))); mp.qScale != want {
				t.Errorf("q scale %v, want %v", mp.qScale, want)
			}
		})
	}
}

func TestPlanInflateErrors(t *testing.T) {
	src := Shape{Name: "src", Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4}
	for _, tc := range []struct {
		big  Shape
		want string
	}{
		{Shape{Name: "narrow", Dim: 32, Hidden: 172, Layers: 5, Heads: 4, KVHeads: 4}, "width 32"},
		{Shape{Name: "thin-ffn", Dim: 128, Hidden: 100, Layers: 5, Heads: 8, KVHeads: 4}, "feed-forward length 100"},
		{Shape{Name: "shallow", Dim: 128, Hidden: 256, Layers: 4, Heads: 8, KVHeads: 4}, "4 layers"},
		{Shape{Name: "odd-head", Dim: 120, Hidden: 256, Layers: 5, Heads: 10, KVHeads: 2}, "head dim 12 is not a multiple of the source's 8"},
		{Shape{Name: "few-kv", Dim: 128, Hidden: 256, Layers: 5, Heads: 8, KVHeads: 2}, "cannot host the source's 4 KV heads"},
	} {
		t.Run(tc.big.Name, func(t *testing.T) {
			_, err := planInflate(src, tc.big)
			if !errors.Is(err, ErrInflateShape) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrInflateShape saying %q", err, tc.want)
			}
		})
	}
}

// TestNamedShapesFor: an inflate that does not fit names the shapes
// that do; stories260K's 4 KV heads of 2 query heads each need 8 KV
// heads of stories15m's 6-head shape.
func TestNamedShapesFor(t *testing.T) {
	stories := Shape{Name: "stories260K", Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4}
	if got, want := namedShapesFor(stories), "the named shapes it fits: llama2-7b, stories110m, tinyllama-1.1b"; got != want {
		t.Errorf("stories260K: %q, want %q", got, want)
	}
	huge := Shape{Name: "huge", Dim: 8192, Hidden: 28672, Layers: 80, Heads: 64, KVHeads: 8}
	if got := namedShapesFor(huge); !strings.Contains(got, "none") {
		t.Errorf("a source larger than every named shape: %q", got)
	}
}

// tinyLlama2C builds a small random llama2.c model in memory.
func tinyLlama2C(t *testing.T) *File {
	t.Helper()
	sh := Shape{Name: "tiny", Dim: 16, Hidden: 40, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 32, Context: 16}
	h := Llama2CHeader{Dim: sh.Dim, HiddenDim: sh.Hidden, Layers: sh.Layers, Heads: sh.Heads, KVHeads: sh.KVHeads, Vocab: sh.Vocab, SeqLen: sh.Context, Tied: true}
	n := 0
	for _, s := range h.tensors() {
		n += int(s.layers * s.rows * s.cols)
	}
	f32 := make([]float32, n)
	fillUniform(f32, 7, 0, 0)
	data := make([]byte, llama2CHeaderBytes+4*n)
	for i, v := range []int{sh.Dim, sh.Hidden, sh.Layers, sh.Heads, sh.KVHeads, sh.Vocab, sh.Context} {
		putU32(data[4*i:], uint32(v))
	}
	for i, v := range f32 {
		putU32(data[llama2CHeaderBytes+4*i:], math.Float32bits(v))
	}
	f, err := ParseLlama2C(data, "tiny.bin")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// TestInflateLayout writes an inflated model and checks its tensors
// element by element against the rules: source values (q scaled) at their
// mapped places, norms scaled by sqrt(d/D), zeros everywhere else,
// including whole extra layers, in F32 and after Q8_0 (zero blocks stay
// exact zeros).
func TestInflateLayout(t *testing.T) {
	src := tinyLlama2C(t)
	big := Shape{Name: "big", Dim: 64, Hidden: 96, Layers: 3, Heads: 8, KVHeads: 4}
	for _, typ := range []DType{F32, Q8_0} {
		t.Run(typ.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "big.gguf")
			var calls int
			if err := Inflate(src, path, InflateOptions{Shape: big, Type: typ, Progress: func(done, total uint64) {
				calls++
				if done > total {
					t.Errorf("progress %d of %d", done, total)
				}
			}}); err != nil {
				t.Fatal(err)
			}
			if calls == 0 {
				t.Error("no progress reported")
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			s, err := readSource(src)
			if err != nil {
				t.Fatal(err)
			}
			if c, _ := f.Metadata.Uint("llama.context_length"); c != 16 {
				t.Errorf("context %d, want the source's 16", c)
			}
			if eps, _ := f.Metadata.Float("llama.attention.layer_norm_rms_epsilon"); math.Abs(eps-1e-5*16/64) > 1e-12 {
				t.Errorf("epsilon %g, want %g", eps, 1e-5*16/64)
			}
			bs := big
			bs.Vocab = 32
			mp, _ := planInflate(s.Shape, bs)
			tol := 0.0
			if typ != F32 {
				tol = 0.02 // Q8_0 rounding of values within ±0.035·sqrt(2)
			}
			for _, info := range bs.Tensors(typ) {
				bt, ok := f.Tensor(info.Name)
				if !ok {
					t.Fatalf("tensor %s missing", info.Name)
				}
				rows, cols := bt.Rows()
				got := make([]float32, rows*cols)
				if err := Dequantize(bt.Type, bt.Data, got); err != nil {
					t.Fatal(err)
				}
				r := s.rule(mp, info.Name)
				var st *Tensor
				var sv []float32
				if r.src != "" {
					st, _ = src.Tensor(r.src)
					sv = make([]float32, st.Elements())
					Dequantize(st.Type, st.Data, sv)
				}
				nonzero := 0
				for R := 0; R < rows; R++ {
					for C := 0; C < cols; C++ {
						want := float32(0)
						if st != nil && r.rows[R] >= 0 && r.cols[C] >= 0 {
							want = sv[int(r.rows[R])*int(st.Shape[0])+int(r.cols[C])] * r.scale
							nonzero++
						}
						g := got[R*cols+C]
						if want == 0 && g != 0 || math.Abs(float64(g-want)) > tol {
							t.Fatalf("%s [%d,%d] = %v, want %v", info.Name, R, C, g, want)
						}
					}
				}
				if strings.HasPrefix(info.Name, "blk.2.") && nonzero != 0 {
					t.Errorf("extra layer tensor %s has %d source values", info.Name, nonzero)
				}
				if !strings.HasPrefix(info.Name, "blk.2.") && nonzero == 0 {
					t.Errorf("tensor %s holds nothing of the source", info.Name)
				}
			}
		})
	}
}

// TestInflateStreams inflates into a ~40 MB F32 model and checks the
// writer allocated a small fraction of that: rows are built and written
// one at a time.
func TestInflateStreams(t *testing.T) {
	src := tinyLlama2C(t)
	big := Shape{Name: "big", Dim: 512, Hidden: 2048, Layers: 3, Heads: 8, KVHeads: 4}
	path := filepath.Join(t.TempDir(), "big.gguf")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := Inflate(src, path, InflateOptions{Shape: big, Type: F32}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > uint64(f.Size)/8 {
		t.Errorf("inflating to %d bytes allocated %d", f.Size, alloc)
	}
	t.Logf("wrote %d bytes, allocated %d", f.Size, alloc)
}

func TestInflateErrors(t *testing.T) {
	src := tinyLlama2C(t)
	dir := t.TempDir()
	big := Shape{Name: "big", Dim: 64, Hidden: 96, Layers: 3, Heads: 8, KVHeads: 4}
	wrongVocab := ByteVocab(300)
	for _, tc := range []struct {
		name string
		opt  InflateOptions
		want string
	}{
		{"type", InflateOptions{Shape: big, Type: Q4_K}, "cannot write"},
		{"shape", InflateOptions{Shape: Shape{Name: "s", Dim: 8, Hidden: 96, Layers: 3, Heads: 2, KVHeads: 2}, Type: F32}, "width 8"},
		{"invalid", InflateOptions{Shape: Shape{Name: "bad", Dim: 64, Hidden: 96, Layers: 3, Heads: 7, KVHeads: 7}, Type: F32}, "not heads 7"},
		{"vocab", InflateOptions{Shape: big, Type: F32, Tokenizer: wrongVocab}, "tokenizer has 300 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Inflate(src, filepath.Join(dir, tc.name+".gguf"), tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
	// A source that is not a llama model.
	md := &Metadata{}
	md.Set("general.architecture", StringValue("gpt2"))
	other := &File{Path: "gpt2.gguf", Metadata: *md}
	if err := Inflate(other, filepath.Join(dir, "x.gguf"), InflateOptions{Shape: big, Type: F32}); err == nil || !strings.Contains(err.Error(), "gpt2") {
		t.Fatalf("gpt2 source: err %v", err)
	}
}
