//go:build cuda

package model

import (
	"bytes"
	"math"
	"os"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// The GPU lane: the same recipe on the cuda backend. Without a GPU this
// binary skips (kernels/cuda/internal/cuinit).

func gpuDevice() string {
	if d := os.Getenv("TANDEM_CUDA_DEVICE"); d != "" {
		return "cuda:" + d
	}
	return "cuda"
}

func loadOn(t testing.TB, f *weights.File, device string) *Model {
	t.Helper()
	m, err := Load(f, Options{Threads: 2, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func openShared(t testing.TB, name string) *weights.File {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestCUDAParity reproduces the reference greedy runs on the GPU with the
// same bounds as TestParity: with an F32 cache every token and the
// first-step logits within 1e-4 + 1e-5·|reference|; with an F16 cache the
// first 20 tokens of each record and the logits within 0.5.
func TestCUDAParity(t *testing.T) {
	for _, tc := range []struct{ model, refs string }{
		{"stories260K.bin", "stories260K.greedy.jsonl"},
		{"stories260K.gguf", "stories260K.greedy.jsonl"},
		{"llama2xs_model.bin", "llama2xs.greedy.jsonl"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m := loadOn(t, openShared(t, tc.model), gpuDevice())
			recs := readRecords(t, tc.refs)
			for _, ct := range []struct {
				typ     weights.DType
				logitTo float64
				tokens  int
			}{
				{weights.F32, 1e-4, 0},
				{weights.F16, 0.5, 20},
			} {
				t.Run(ct.typ.String(), func(t *testing.T) {
					checkRecords(t, m, recs, ct.typ, ct.logitTo, ct.tokens)
				})
			}
		})
	}
}

// treeRun drives one model through a prefill, a token tree in one batch,
// a commit of a path through the tree (compacted where the rows live),
// and a decode step after it, returning every logits row it produced.
func treeRun(t *testing.T, m *Model, typ weights.DType, prompt []int32) [][]float32 {
	t.Helper()
	cache, err := m.NewCache(64, typ)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := cache.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]float32
	var b Batch
	var out Logits
	keep := func() {
		for _, s := range out.Slots() {
			rows = append(rows, append([]float32(nil), out.Row(s)...))
		}
	}
	b.Chain(prompt, 0, seq, -1, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	keep()
	cache.CommitAll(seq)
	// Tree: a; b under a; c under a; d under c; e under b.
	L := int32(len(prompt))
	b.Reset()
	a := b.Add(5, L, seq, -1, true)
	bb := b.Add(9, L+1, seq, a, true)
	c := b.Add(11, L+1, seq, a, true)
	b.Add(13, L+2, seq, c, true)
	b.Add(17, L+2, seq, bb, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	keep()
	// Keep a -> c -> d: rows 2 and 3 move down to 1 and 2.
	if err := cache.Commit(seq, []int{0, 2, 3}); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	b.Add(19, L+3, seq, -1, true)
	b.Add(23, L+4, seq, 0, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	keep()
	return rows
}

// TestCUDAMatchesCPU runs prefill, a token tree, a path commit (device
// row moves) and decode on the GPU and on the CPU, for F32, F16, Q8_0 and
// Q4_0 weights and both cache types, and holds every logit to the CPU's.
// The GPU sums in other orders, and for the quantized types a float32
// difference can flip the rounding of a quantized activation (a change of
// half its block's scale), so the bound is per type. Measured on an H100
// (worst over both cache types): F32 8.7e-6, F16 5.9e-5, Q8_0 7.4e-4,
// Q4_0 0.029. A decode after the commit that attended to a wrong or
// unmoved row would be off by far more.
func TestCUDAMatchesCPU(t *testing.T) {
	src := openShared(t, "stories260K.bin")
	prompt := readRecords(t, "stories260K.greedy.jsonl")[0].PromptIDs
	bound := map[weights.DType]float64{weights.F32: 1e-3, weights.F16: 1e-3, weights.Q8_0: 0.01, weights.Q4_0: 0.15}
	for _, wt := range []weights.DType{weights.F32, weights.F16, weights.Q8_0, weights.Q4_0} {
		var buf bytes.Buffer
		if err := weights.Convert(src, &buf, weights.ConvertOptions{Type: wt}); err != nil {
			t.Fatal(err)
		}
		f, err := weights.ParseGGUF(buf.Bytes(), "stories260K-"+wt.String())
		if err != nil {
			t.Fatal(err)
		}
		cpu, gpu := loadOn(t, f, "cpu"), loadOn(t, f, gpuDevice())
		for _, ct := range []weights.DType{weights.F32, weights.F16} {
			t.Run(wt.String()+"/kv="+ct.String(), func(t *testing.T) {
				want, got := treeRun(t, cpu, ct, prompt), treeRun(t, gpu, ct, prompt)
				if len(got) != len(want) {
					t.Fatalf("%d logits rows on the GPU, %d on the CPU", len(got), len(want))
				}
				var worst float64
				for r := range want {
					for i := range want[r] {
						d := math.Abs(float64(got[r][i] - want[r][i]))
						worst = max(worst, d)
						if !(d <= bound[wt]) {
							t.Fatalf("logits row %d [%d]: GPU %g, CPU %g (|diff| %.3g > %g)", r, i, got[r][i], want[r][i], d, bound[wt])
						}
					}
				}
				t.Logf("%d logits rows, worst |GPU-CPU| %.3g", len(want), worst)
			})
		}
	}
}

// TestCUDAMisuse: caches and models of different devices refuse each
// other, a missing GPU is named, a closed model's cache refuses new work.
func TestCUDAMisuse(t *testing.T) {
	f := openShared(t, "stories260K.bin")
	cpu, gpu := loadOn(t, f, "cpu"), loadOn(t, f, gpuDevice())
	cpuCache, _ := cpu.NewCache(16, weights.F32)
	gpuCache, _ := gpu.NewCache(16, weights.F32)
	for _, tc := range []struct {
		name  string
		m     *Model
		cache *kv.Cache
	}{{"gpu model, cpu cache", gpu, cpuCache}, {"cpu model, gpu cache", cpu, gpuCache}} {
		seq, err := tc.cache.NewSeq()
		if err != nil {
			t.Fatal(err)
		}
		var b Batch
		var out Logits
		b.Add(1, 0, seq, -1, true)
		if err := tc.m.Forward(&b, tc.cache, &out); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
		if tc.cache.Tentative(seq) != 0 {
			t.Errorf("%s: the failed Forward left %d tentative rows", tc.name, tc.cache.Tentative(seq))
		}
	}
	if _, err := Load(f, Options{Device: "cuda:99"}); err == nil {
		t.Error("cuda:99: no error")
	}
	m, err := Load(f, Options{Threads: 1, Device: gpuDevice()})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := m.NewCache(16, weights.F16)
	m.Close()
	if _, err := c.NewSeq(); err == nil {
		t.Error("NewSeq on a closed GPU model's cache: no error")
	}
}
