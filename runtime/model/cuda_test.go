//go:build cuda

package model

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cuda"
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

// treeRun drives one model through a prefill, then twice a token tree in
// one batch, a commit of a path through it (compacted where the rows
// live) and a decode after it, returning every logits row.
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
	// A prefill of more than graphSlots tokens runs eagerly; the tree and
	// decode passes are recorded as graphs, then replayed.
	for len(prompt) <= graphSlots {
		prompt = append(prompt, prompt...)
	}
	var rows [][]float32
	var b Batch
	var out Logits
	forward := func() {
		t.Helper()
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		for _, s := range out.Slots() {
			rows = append(rows, append([]float32(nil), out.Row(s)...))
		}
	}
	b.Chain(prompt, 0, seq, -1, true)
	forward()
	cache.CommitAll(seq)
	// Twice, at new positions the second time (the GPU replays): a tree
	// (a; b under a; c under a; d under c; e under b), a commit of a path
	// through it (rows move down), and a two-token decode after it.
	L := int32(len(prompt))
	for round, path := range [][]int{{0, 2, 3}, {0, 1, 4}} {
		tok := int32(5 + 40*round)
		b.Reset()
		a := b.Add(tok, L, seq, -1, true)
		bb := b.Add(tok+4, L+1, seq, a, true)
		c := b.Add(tok+6, L+1, seq, a, true)
		b.Add(tok+8, L+2, seq, c, true)
		b.Add(tok+12, L+2, seq, bb, true)
		forward()
		if err := cache.Commit(seq, path); err != nil {
			t.Fatal(err)
		}
		b.Reset()
		b.Add(tok+14, L+3, seq, -1, true)
		b.Add(tok+18, L+4, seq, 0, true)
		forward()
		cache.CommitAll(seq)
		L += 5
	}
	return rows
}

// TestCUDAMatchesCPU runs prefill, a token tree, a path commit (device
// row moves) and decode on the GPU and on the CPU, for F32, F16, Q8_0 and
// Q4_0 weights and both cache types, and holds every logit to the CPU's.
// The GPU sums in other orders, and a float32 difference can flip the
// rounding of a quantized activation (half its block's scale) or of a K or
// V value in an F16 cache (half an f16 step), so the bound is per weight
// and cache type. Worst measured on an H100 over two runs: F32 and F16
// weights 8.7e-6 with an F32 cache, 8.5e-4 with an F16 cache; Q8_0 7.4e-4;
// Q4_0 0.029. A decode after the commit that attended to a wrong or
// unmoved row would be off by far more.
func TestCUDAMatchesCPU(t *testing.T) {
	src := openShared(t, "stories260K.bin")
	prompt := readRecords(t, "stories260K.greedy.jsonl")[0].PromptIDs
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
				t.Logf("%d logits rows, worst |GPU-CPU| %.3g", len(want), checkGPURows(t, got, want, wt, ct))
			})
		}
	}
}

// gpuBound is TestCUDAMatchesCPU's per-weight-type bound on |GPU - CPU|
// logits; an F16 cache widens it to 0.01 (see there).
var gpuBound = map[weights.DType]float64{weights.F32: 1e-4, weights.F16: 1e-4, weights.Q8_0: 0.01, weights.Q4_0: 0.15}

// checkGPURows holds every GPU logit to the CPU's within gpuBound and
// returns the worst difference.
func checkGPURows(t *testing.T, got, want [][]float32, wt, ct weights.DType) float64 {
	t.Helper()
	limit := gpuBound[wt]
	if ct == weights.F16 {
		limit = max(limit, 0.01)
	}
	var worst float64
	for r := range want {
		for i := range want[r] {
			d := math.Abs(float64(got[r][i] - want[r][i]))
			worst = max(worst, d)
			if !(d <= limit) {
				t.Fatalf("logits row %d [%d]: GPU %g, CPU %g (|diff| %.3g > %g)", r, i, got[r][i], want[r][i], d, limit)
			}
		}
	}
	return worst
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
		seq := newSeq(t, tc.cache)
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

// loadStreamedOn loads path on device with its weights streaming under
// opt; the model and file close when the test ends.
func loadStreamedOn(t testing.TB, path, device string, opt weights.StreamOptions) *Model {
	t.Helper()
	m, _ := loadPath(t, path, Options{Threads: 2, Device: device, Stream: &opt})
	return m
}

// smallStaging shrinks the pinned staging chunks for the test, so that
// the copy of every group of the small models wraps around the ring.
func smallStaging(t testing.TB) {
	prev := stagingChunk
	stagingChunk = 16 << 10
	t.Cleanup(func() { stagingChunk = prev })
}

// TestCUDAStreamedParity reproduces the reference greedy runs with the
// weights streamed to the GPU, with TestCUDAParity's F32 bounds (every
// token, first-step logits within 1e-4 + 1e-5·|reference|): at the
// smallest budget every layer and the head go through the device slots
// and the embedding rows are read on the host; at half the model some
// groups stay on the device (stories260K a layer, llama2xs its tied head
// and with it the embedding) in both modes and IO methods; at the whole
// model nothing streams and passes are CUDA graphs again.
func TestCUDAStreamedParity(t *testing.T) {
	smallStaging(t)
	for _, tc := range []struct{ model, refs string }{
		{"stories260K.gguf", "stories260K.greedy.jsonl"},
		{"llama2xs_model.bin", "llama2xs.greedy.jsonl"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			path := testutil.Model(t, tc.model)
			plan := streamPlan(t, openShared(t, tc.model))
			recs := readRecords(t, tc.refs)
			for _, c := range []struct {
				name  string
				opt   weights.StreamOptions
				mixed bool // some groups pinned, some streamed
			}{
				{"stdpl/min", weights.StreamOptions{Budget: plan.Min}, false},
				{"stdpl/half", weights.StreamOptions{Budget: plan.Total / 2}, true},
				{"std/mmap/half", weights.StreamOptions{Budget: plan.Total / 2, Mode: weights.StreamStd, Method: weights.IOMmap}, true},
				{"all pinned", weights.StreamOptions{Budget: plan.Total}, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					c.opt.ChunkBytes = 64 << 10
					m := loadStreamedOn(t, path, gpuDevice(), c.opt)
					st := m.ops.(*cudaOps).st
					pinned := 0
					for _, p := range st.pinned {
						if p {
							pinned++
						}
					}
					streamed := len(st.pinned) - pinned
					if c.mixed && (pinned == 0 || streamed == 0) {
						t.Errorf("budget %d pins %d of %d groups; the test wants some of each", c.opt.Budget, pinned, len(st.pinned))
					}
					if st.any != (streamed > 0) || (streamed > 0) != (len(st.slots) == streamSlots) {
						t.Errorf("%d groups streamed, yet any=%v and %d slots", streamed, st.any, len(st.slots))
					}
					var slot int64
					if len(st.slots) > 0 {
						slot = st.slots[0].buf.Size()
					}
					t.Logf("%d groups on the device, %d streamed through %d slots of %d bytes", pinned, streamed, len(st.slots), slot)
					checkRecords(t, m, recs, weights.F32, 1e-4, 0)
					ss, _ := m.StreamStats()
					if ss.Peak > c.opt.Budget {
						t.Errorf("peak resident %d > budget %d", ss.Peak, c.opt.Budget)
					}
					perPass := m.stream.Plan().Streamed(streamGroups(m.cfg), m.File())
					if ss.Passes == 0 || ss.BytesRead < uint64(ss.Passes)*perPass {
						t.Errorf("%d passes read %d bytes, want at least %d per pass", ss.Passes, ss.BytesRead, perPass)
					}
				})
			}
		})
	}
}

// TestCUDAStreamedMatchesCPU runs treeRun (prefill, token trees, path
// commits moving device rows, decodes) on a GPU model streaming at the
// smallest budget, for F32, F16, Q8_0 (repacked on the upload queue) and
// Q4_0 weights and both cache types. Its logits are the resident GPU
// model's bit for bit (the same kernels read the same bytes; a group in
// the wrong slot, or read before its copy landed, would differ), and so
// within TestCUDAMatchesCPU's bounds of the CPU's.
func TestCUDAStreamedMatchesCPU(t *testing.T) {
	smallStaging(t)
	src := openShared(t, "stories260K.bin")
	prompt := readRecords(t, "stories260K.greedy.jsonl")[0].PromptIDs
	for _, wt := range []weights.DType{weights.F32, weights.F16, weights.Q8_0, weights.Q4_0} {
		path := filepath.Join(t.TempDir(), "stories260K-"+wt.String()+".gguf")
		out, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := weights.Convert(src, out, weights.ConvertOptions{Type: wt}); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		cpu, f := loadPath(t, path, Options{Threads: 2})
		resident := loadOn(t, f, gpuDevice())
		streamed := loadStreamedOn(t, path, gpuDevice(), weights.StreamOptions{Budget: streamPlan(t, f).Min})
		for _, ct := range []weights.DType{weights.F32, weights.F16} {
			t.Run(wt.String()+"/kv="+ct.String(), func(t *testing.T) {
				want, ref, got := treeRun(t, cpu, ct, prompt), treeRun(t, resident, ct, prompt), treeRun(t, streamed, ct, prompt)
				if len(got) != len(want) || len(ref) != len(want) {
					t.Fatalf("%d logits rows streamed, %d resident, %d on the CPU", len(got), len(ref), len(want))
				}
				for r := range ref {
					for i := range ref[r] {
						if math.Float32bits(got[r][i]) != math.Float32bits(ref[r][i]) {
							t.Fatalf("logits row %d [%d]: streamed %g, resident %g", r, i, got[r][i], ref[r][i])
						}
					}
				}
				t.Logf("%d logits rows, streamed = resident, worst |GPU-CPU| %.3g", len(want), checkGPURows(t, got, want, wt, ct))
			})
		}
	}
}

// TestCUDAStreamedDeviceTooSmall: a GPU that cannot hold the streaming
// slots, or the pinned groups next to them, fails Load with an error that
// names them and says the budget is host RAM; a pass that cannot get its
// activations fails that Forward alone; and the same GPU then loads and
// runs the model (allocLimit plays the small device).
func TestCUDAStreamedDeviceTooSmall(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	f := openShared(t, "stories260K.gguf")
	plan := streamPlan(t, f)
	rec := readRecords(t, "stories260K.greedy.jsonl")[0]
	t.Cleanup(func() { allocLimit = 0 })

	// The device memory streaming takes: slots and repack scratch.
	probe := loadStreamedOn(t, path, gpuDevice(), weights.StreamOptions{Budget: plan.Total / 2})
	var slots int64
	for _, sl := range probe.ops.(*cudaOps).st.slots {
		slots += sl.buf.Size()
	}
	slots += probe.ops.(*cudaOps).st.scratch.Size()
	for _, tc := range []struct {
		name   string
		budget uint64
		limit  int64
		want   []string
	}{
		{"no room for the slots", plan.Min, slots - 1, []string{"slots", "largest streamed group", "bounds host RAM", "out of memory"}},
		{"no room for the pinned groups", plan.Total / 2, slots, []string{"pinned group", "bounds host RAM", "smaller budget"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocLimit = tc.limit
			defer func() { allocLimit = 0 }()
			g, err := weights.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			m, err := Load(g, Options{Threads: 1, Device: gpuDevice(), Stream: &weights.StreamOptions{Budget: tc.budget}})
			if err == nil {
				m.Close()
				t.Fatalf("loaded within a %d-byte device", tc.limit)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}

	m := loadStreamedOn(t, path, gpuDevice(), weights.StreamOptions{Budget: plan.Min})
	cache := newCache(t, m, 0)
	seq := newSeq(t, cache)
	// Every device byte the model has is in use, and its first pass needs
	// activations.
	var used int64
	for _, b := range m.ops.(*cudaOps).owned {
		used += b.Size()
	}
	allocLimit = used
	var b Batch
	var out Logits
	b.Chain(rec.PromptIDs, 0, seq, -1, true)
	err := m.Forward(&b, cache, &out)
	if err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("forward past the device's memory: err %v, want an allocation failure", err)
	}
	if cache.Tentative(seq) != 0 {
		t.Errorf("the failed Forward left %d tentative rows", cache.Tentative(seq))
	}
	allocLimit = 0
	cache.Free(seq)
	checkRecords(t, m, []record{rec}, weights.F32, 1e-4, 0)
}

// TestCUDAStreamSurvivesTruncation is TestStreamSurvivesTruncation on the
// GPU: the reads of a pass fail midway (groups already copied to slots,
// compute queued on them), Forward says the file changed, and once the
// file is whole again the same model decodes the reference tokens.
func TestCUDAStreamSurvivesTruncation(t *testing.T) {
	// Std mode reads each group when the pass asks for it, so the pass
	// gets as far as the half of the file that is left.
	checkSurvivesTruncation(t, func(f *weights.File) (*Model, error) {
		return Load(f, Options{Threads: 1, Device: gpuDevice(), Stream: &weights.StreamOptions{Budget: streamPlan(t, f).Min, Mode: weights.StreamStd}})
	})
}

// BenchmarkCUDADecode synthesizes random-weight models of real shapes
// (TANDEM_BENCH_SHAPES, default tinyllama-1.1b; TANDEM_BENCH_TYPES,
// default q4_0,q8_0,f16) in a temporary folder and measures, on the GPU,
// a 128-token prefill and 64 decode steps, 5 runs, reporting medians next
// to the memory bound: weight bytes per decode step ÷ the device copy
// bandwidth measured in the same run (kernels/cuda BenchmarkCopy's method).
func BenchmarkCUDADecode(b *testing.B) {
	shapes := strings.Split(cmpEnv("TANDEM_BENCH_SHAPES", "tinyllama-1.1b"), ",")
	types := strings.Split(cmpEnv("TANDEM_BENCH_TYPES", "q4_0,q8_0,f16"), ",")
	bw := copyBandwidth(b)
	b.Logf("device copy bandwidth %.0f GB/s (read + write)", bw/1e9)
	for _, sn := range shapes {
		shape, err := weights.LookupShape(sn)
		if err != nil {
			b.Fatal(err)
		}
		for _, tn := range types {
			wt, err := weights.ParseDType(tn)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(sn+"/"+tn, func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "m.gguf")
				if err := weights.Synth(path, weights.SynthOptions{Shape: shape, Type: wt, Seed: 1}); err != nil {
					b.Fatal(err)
				}
				f, err := weights.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				m := loadOn(b, f, gpuDevice())
				var perToken uint64
				for _, t := range f.Tensors {
					if t.Name == "token_embd.weight" {
						rows, _ := t.Rows()
						perToken += t.Size / uint64(rows)
					} else {
						perToken += t.Size
					}
				}
				prefill, decode := decodeRuns(b, m, 128, 64, 5)
				bound := bw / float64(perToken)
				b.ReportMetric(decode, "decode-tok/s")
				b.ReportMetric(bound, "bound-tok/s")
				b.ReportMetric(100*decode/bound, "%-of-bound")
				b.ReportMetric(prefill, "prefill-tok/s")
				b.Logf("%s %s: %.0f MiB/token, decode %.1f tok/s (bound %.1f, %.0f%%), prefill %.0f tok/s",
					sn, tn, float64(perToken)/(1<<20), decode, bound, 100*decode/bound, prefill)
			})
		}
	}
}

func cmpEnv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// decodeRuns returns the median prefill and decode tokens/s over runs.
func decodeRuns(b *testing.B, m *Model, prompt, gen, runs int) (prefill, decode float64) {
	cache, err := m.NewCache(prompt+gen, weights.F16)
	if err != nil {
		b.Fatal(err)
	}
	toks := make([]int32, prompt)
	for i := range toks {
		toks[i] = int32((i*7919 + 13) % m.Config().Vocab)
	}
	var ps, ds []float64
	var bt Batch
	var out Logits
	for r := 0; r < runs; r++ {
		seq, err := cache.NewSeq()
		if err != nil {
			b.Fatal(err)
		}
		bt.Reset()
		bt.Chain(toks, 0, seq, -1, true)
		start := time.Now()
		if err := m.Forward(&bt, cache, &out); err != nil {
			b.Fatal(err)
		}
		ps = append(ps, float64(prompt)/time.Since(start).Seconds())
		cache.CommitAll(seq)
		id := argmax(out.Row(prompt - 1))
		start = time.Now()
		for i := 0; i < gen; i++ {
			bt.Reset()
			bt.Add(id, int32(cache.Len(seq)), seq, -1, true)
			if err := m.Forward(&bt, cache, &out); err != nil {
				b.Fatal(err)
			}
			cache.CommitAll(seq)
			id = argmax(out.Row(0))
		}
		ds = append(ds, float64(gen)/time.Since(start).Seconds())
		cache.Free(seq)
	}
	slices.Sort(ps)
	slices.Sort(ds)
	return ps[len(ps)/2], ds[len(ds)/2]
}

// copyBandwidth times 1 GiB device-to-device copies (bytes read plus
// written per second, median of 5).
func copyBandwidth(b *testing.B) float64 {
	d, err := cuda.Open(0)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const size = 1 << 30
	src, err1 := d.Alloc(size)
	dst, err2 := d.Alloc(size)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatal(err)
	}
	defer d.Free(src)
	defer d.Free(dst)
	var rates []float64
	for r := 0; r < 6; r++ {
		start := time.Now()
		for i := 0; i < 5; i++ {
			s.Copy(dst, src)
		}
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
		if r > 0 { // the first warms up
			rates = append(rates, 5*2*size/time.Since(start).Seconds())
		}
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}
