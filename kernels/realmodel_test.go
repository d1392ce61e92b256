package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// TestMatMulRealWeights multiplies real model tensors: the F16 output
// matrix of llama-2-tiny-random (32000×8) and stories260K's F32 FFN gate,
// as stored and re-quantized to Q8_0 and Q4_0, against the float64
// reference on the decoded weights, on every backend.
func TestMatMulRealWeights(t *testing.T) {
	type job struct {
		file, tensor string
		as           weights.DType // re-encode as this type (F32: keep)
	}
	jobs := []job{
		{"llama-2-tiny-random.gguf", "output.weight", weights.F16},
		{"llama-2-tiny-random.gguf", "blk.0.ffn_up.weight", weights.F16},
		{"stories260K.gguf", "blk.0.ffn_gate.weight", weights.F32},
		{"stories260K.gguf", "blk.0.ffn_gate.weight", weights.Q8_0},
		{"stories260K.gguf", "blk.0.ffn_gate.weight", weights.Q4_0},
		{"stories260K.gguf", "blk.4.attn_q.weight", weights.Q4_0},
	}
	pool := NewPool(2)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	for _, jb := range jobs {
		t.Run(fmt.Sprintf("%s/%s/%s", jb.file, jb.tensor, jb.as), func(t *testing.T) {
			f, err := weights.Open(testutil.Model(t, jb.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			tn, ok := f.Tensor(jb.tensor)
			if !ok {
				t.Fatalf("%s: no tensor %s", jb.file, jb.tensor)
			}
			rows, cols := tn.Rows()
			w := tn.Data
			if tn.Type != jb.as {
				vals := make([]float32, rows*cols)
				if err := weights.Dequantize(tn.Type, tn.Data, vals); err != nil {
					t.Fatal(err)
				}
				rb, _ := jb.as.RowBytes(uint64(cols))
				w = make([]byte, int(rb)*rows)
				if err := weights.Quantize(jb.as, vals, w); err != nil {
					t.Fatal(err)
				}
			}
			deq := make([]float32, rows*cols)
			if err := weights.Dequantize(jb.as, w, deq); err != nil {
				t.Fatal(err)
			}
			const n = 3
			x := randomVector(rng, n*cols)
			ref, tol, _ := matmulBound(jb.as, deq, rows, cols, x, n)
			for _, be := range testBackends() {
				withBackend(t, be, func() {
					out := make([]float32, n*rows)
					if err := pool.MatMul(out, w, jb.as, rows, cols, x, n); err != nil {
						t.Fatal(err)
					}
					for i, v := range out {
						if d := math.Abs(float64(v) - ref[i]); !(d <= tol[i]) {
							t.Fatalf("%s: out[%d] = %g, reference %g (error %g > %g)", be, i, v, ref[i], d, tol[i])
						}
					}
				})
			}
		})
	}
}
