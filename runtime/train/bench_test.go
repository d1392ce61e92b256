package train

import (
	"fmt"
	"os"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
)

// BenchmarkStep measures one training step (forward, backward, AdamW) of
// the default pair's shapes at 1 and 2 threads and reports tokens per
// second. TANDEM_BENCH_SHAPES overrides the shapes
// ("dim,hidden,layers,heads,kv,ctx;..."), TANDEM_BENCH_VOCAB the vocabulary.
func BenchmarkStep(b *testing.B) {
	shapes := []string{"192,512,6,6,3,256", "96,256,3,4,2,256"} // the default pair (Makefile: models)
	if s := os.Getenv("TANDEM_BENCH_SHAPES"); s != "" {
		shapes = splitList(s)
	}
	vocab := 1024
	if v := os.Getenv("TANDEM_BENCH_VOCAB"); v != "" {
		fmt.Sscan(v, &vocab)
	}
	for _, sh := range shapes {
		c, err := ParseShape(sh, vocab, 256)
		if err != nil {
			b.Fatal(err)
		}
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("shape=%s/params=%d/threads=%d", sh, CountParams(c), threads), func(b *testing.B) {
				pool := kernels.NewPool(threads)
				defer pool.Close()
				p, _ := NewParams[float32](c)
				p.Init(1)
				g, _ := NewParams[float32](c)
				e, _ := NewEngine[float32](c, pool)
				opt := NewAdamW(len(p.Data))
				const B = 8
				batch := randomBatch(c, B, c.Context, 1, false, false)
				b.ResetTimer()
				for range b.N {
					if _, err := e.Forward(p, batch); err != nil {
						b.Fatal(err)
					}
					e.Backward(p, g)
					opt.Step(pool, p, g, 1e-3, 1)
				}
				b.ReportMetric(float64(b.N*B*c.Context)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

func splitList(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ';' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}
