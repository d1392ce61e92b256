package weights

import (
	"bytes"
	"math"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestDequantizeRealTensors decodes every tensor of a real GGUF file (9 F16
// and 3 F32 tensors), checks the values are finite and that re-encoding
// them as their own type gives back the file's bytes, then pushes each
// tensor through every block type and checks the documented error bounds.
func TestDequantizeRealTensors(t *testing.T) {
	f, err := Open(testutil.Model(t, "llama-2-tiny-random.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[DType]int{}
	for _, tn := range f.Tensors {
		t.Run(tn.Name, func(t *testing.T) {
			seen[tn.Type]++
			n := int(tn.Elements())
			x := make([]float32, n)
			if err := Dequantize(tn.Type, tn.Data, x); err != nil {
				t.Fatal(err)
			}
			var sq float64
			for i, v := range x {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("weight %d is %g", i, v)
				}
				sq += float64(v) * float64(v)
			}
			if sq == 0 {
				t.Fatal("tensor decodes to all zeros")
			}
			back := make([]byte, len(tn.Data))
			if err := Quantize(tn.Type, x, back); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, tn.Data) {
				t.Fatalf("re-encoding as %s does not reproduce the file bytes", tn.Type)
			}
			for _, typ := range blockTypes {
				bs, ts := typ.BlockSize(), typ.TypeSize()
				m := n / bs * bs
				if m == 0 {
					continue
				}
				q := make([]byte, m/bs*ts)
				if err := Quantize(typ, x[:m], q); err != nil {
					t.Fatalf("%s: %v", typ, err)
				}
				y := make([]float32, m)
				if err := Dequantize(typ, q, y); err != nil {
					t.Fatalf("%s: %v", typ, err)
				}
				var se float64
				for blk := 0; blk < m/bs; blk++ {
					bound := errorBound(typ, x[blk*bs:(blk+1)*bs], q[blk*ts:(blk+1)*ts])
					for i, b := range bound {
						k := blk*bs + i
						e := math.Abs(float64(y[k] - x[k]))
						if e > b {
							t.Fatalf("%s weight %d: %g decodes to %g, error %g > bound %g", typ, k, x[k], y[k], e, b)
						}
						se += e * e
					}
				}
				t.Logf("%s: %d weights, relative RMS error %.4f", typ, m, math.Sqrt(se/sq))
			}
		})
	}
	if seen[F16] != 9 || seen[F32] != 3 {
		t.Errorf("tensor types %v, want 9 F16 and 3 F32", seen)
	}
}
