package model

import (
	"bytes"
	"math"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// TestQuantizedModels converts stories260K to F16, Q8_0 and Q4_0 weights
// (its 172-wide ffn_down rows fall back to F16 for the block types) and
// checks the first-step logits of every reference record stay close to
// the F32 reference and mostly pick the same first token. Measured over
// the 8 records (logits span about ±15): worst |diff| F16 0.0091, Q8_0
// 0.27, Q4_0 3.5; first token agrees 8/8, 8/8, 7/8. A 64-wide model has
// little redundancy, so 4-bit weights cost it far more than a 7B model.
func TestQuantizedModels(t *testing.T) {
	recs := readRecords(t, "stories260K.greedy.jsonl")
	for _, tc := range []struct {
		typ      weights.DType
		bound    float64
		minAgree int
	}{
		{weights.F16, 0.03, 8},
		{weights.Q8_0, 0.6, 8},
		{weights.Q4_0, 6, 6},
	} {
		t.Run(tc.typ.String(), func(t *testing.T) {
			m := loadConverted(t, "stories260K.bin", tc.typ)
			backends(t, func(t *testing.T) {
				cache, err := m.NewCache(64, weights.F32)
				if err != nil {
					t.Fatal(err)
				}
				var worst float64
				agree := 0
				for _, r := range recs {
					seq, _ := cache.NewSeq()
					var b Batch
					var out Logits
					b.Chain(r.PromptIDs, 0, seq, -1, true)
					if err := m.Forward(&b, cache, &out); err != nil {
						t.Fatal(err)
					}
					cache.Free(seq)
					row := out.Row(len(r.PromptIDs) - 1)
					for i, v := range row {
						worst = max(worst, math.Abs(float64(v-r.FirstLogits[i])))
					}
					if argmax(row) == r.GeneratedIDs[0] {
						agree++
					}
				}
				t.Logf("%s weights: worst first-logit |diff| %.3g, first token agrees on %d of %d records", tc.typ, worst, agree, len(recs))
				if agree < tc.minAgree {
					t.Errorf("%s weights: first token agrees with F32 on %d of %d records, want at least %d", tc.typ, agree, len(recs), tc.minAgree)
				}
				if !(worst <= tc.bound) {
					t.Errorf("%s weights: first logits differ from F32 by up to %.3g (bound %.3g)", tc.typ, worst, tc.bound)
				}
			})
		})
	}
}

// loadConverted loads a shared model converted in memory to weight type
// typ (weights.Convert's rules: rows that do not fit typ's blocks stay
// F16); it is closed when the test ends.
func loadConverted(t testing.TB, name string, typ weights.DType) *Model {
	t.Helper()
	return loadConvertedThreads(t, name, typ, 2)
}

// loadConvertedThreads is loadConverted computing on threads threads.
func loadConvertedThreads(t testing.TB, name string, typ weights.DType, threads int) *Model {
	t.Helper()
	return loadConvertedWith(t, name, typ, Options{Threads: threads})
}

// loadConvertedWith is loadConverted loaded with opt.
func loadConvertedWith(t testing.TB, name string, typ weights.DType, opt Options) *Model {
	t.Helper()
	src, err := weights.Open(testutil.Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var buf bytes.Buffer
	if err := weights.Convert(src, &buf, weights.ConvertOptions{Type: typ}); err != nil {
		t.Fatal(err)
	}
	f, err := weights.ParseGGUF(buf.Bytes(), name+"-"+typ.String())
	if err != nil {
		t.Fatal(err)
	}
	return loadWith(t, f, opt)
}

// loadThreads loads f computing on threads threads, closed when the test
// ends.
func loadThreads(t testing.TB, f *weights.File, threads int) *Model {
	t.Helper()
	return loadWith(t, f, Options{Threads: threads})
}

// loadWith loads f with opt, closed when the test ends.
func loadWith(t testing.TB, f *weights.File, opt Options) *Model {
	t.Helper()
	m, err := Load(f, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
