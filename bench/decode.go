package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// DecodeConfig describes one decode/prefill measurement.
type DecodeConfig struct {
	Threads      int // kernel threads (0: kernels.DefaultThreads)
	PromptTokens int // prefill length (default 512)
	DecodeTokens int // tokens decoded per run (default 32)
	Runs         int // measured runs; medians are reported (default 5)
}

// DecodeResult is what one model measured at one thread count.
type DecodeResult struct {
	Model   string
	Type    string // the type of most weight bytes
	Threads int
	// WeightBytesPerToken is what one decode step must read: every matrix
	// except the embedding table (one row of it is looked up).
	WeightBytesPerToken uint64
	PrefillTokPerS      float64   // median over runs
	DecodeTokPerS       float64   // median over runs
	Prefill, Decode     []float64 // every run's tok/s
	PromptTokens        int
}

// Bound is the decode speed the memory system allows at bw bytes/s:
// bandwidth ÷ weight bytes per token.
func (r DecodeResult) Bound(bw float64) float64 { return bw / float64(r.WeightBytesPerToken) }

// PrefillSpeedup is how much cheaper a token is in a prefill batch.
func (r DecodeResult) PrefillSpeedup() float64 { return r.PrefillTokPerS / r.DecodeTokPerS }

// WeightBytesPerToken sums the matrices a decode step reads.
func WeightBytesPerToken(f *weights.File) (bytes uint64, typ string) {
	byType := map[weights.DType]uint64{}
	for _, t := range f.Tensors {
		if t.Name == "token_embd.weight" {
			rows, _ := t.Rows()
			bytes += t.Size / uint64(rows)
			continue
		}
		bytes += t.Size
		byType[t.Type] += t.Size
	}
	var best uint64
	for t, n := range byType {
		if n > best {
			best, typ = n, t.String()
		}
	}
	return bytes, typ
}

// Decode loads the model in f and measures prefill of a random prompt and
// greedy single-sequence decode, cfg.Runs times each, reporting medians.
func Decode(f *weights.File, cfg DecodeConfig) (DecodeResult, error) {
	cfg.PromptTokens = cmp(cfg.PromptTokens, 512)
	cfg.DecodeTokens = cmp(cfg.DecodeTokens, 32)
	cfg.Runs = cmp(cfg.Runs, 5)
	m, err := model.Load(f, model.Options{Threads: cfg.Threads})
	if err != nil {
		return DecodeResult{}, err
	}
	defer m.Close()
	mc := m.Config()
	need := cfg.PromptTokens + cfg.DecodeTokens
	if need > mc.Context {
		return DecodeResult{}, fmt.Errorf("bench: %d prompt + %d decode tokens exceed the model's context of %d", cfg.PromptTokens, cfg.DecodeTokens, mc.Context)
	}
	cache, err := m.NewCache(need, weights.F32)
	if err != nil {
		return DecodeResult{}, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int32, cfg.PromptTokens)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(mc.Vocab))
	}
	res := DecodeResult{Model: f.Path, Threads: m.Pool().Threads()}
	res.WeightBytesPerToken, res.Type = WeightBytesPerToken(f)
	var prefill, decode []float64
	var b model.Batch
	var out model.Logits
	for run := 0; run < cfg.Runs; run++ {
		seq, err := cache.NewSeq()
		if err != nil {
			return res, err
		}
		b.Reset()
		b.Chain(prompt, 0, seq, -1, true)
		start := time.Now()
		if err := m.Forward(&b, cache, &out); err != nil {
			return res, err
		}
		prefill = append(prefill, float64(len(prompt))/time.Since(start).Seconds())
		if err := cache.CommitAll(seq); err != nil {
			return res, err
		}
		id := argmax(out.Row(b.Len() - 1))
		start = time.Now()
		for i := 0; i < cfg.DecodeTokens; i++ {
			b.Reset()
			b.Add(id, int32(cache.Len(seq)), seq, -1, true)
			if err := m.Forward(&b, cache, &out); err != nil {
				return res, err
			}
			if err := cache.CommitAll(seq); err != nil {
				return res, err
			}
			id = argmax(out.Row(0))
		}
		decode = append(decode, float64(cfg.DecodeTokens)/time.Since(start).Seconds())
		if err := cache.Free(seq); err != nil {
			return res, err
		}
	}
	res.PrefillTokPerS, res.DecodeTokPerS = Median(prefill), Median(decode)
	res.Prefill, res.Decode, res.PromptTokens = prefill, decode, cfg.PromptTokens
	return res, nil
}

func cmp(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// PeakKey names a kernel rate measurement: weight type and threads.
type PeakKey struct {
	Type    string
	Threads int
}

// DecodeTable formats results as a markdown table (mean ± sd over the
// runs) next to both bounds: memory, read bandwidth bw[threads] ÷ weight
// bytes per token, and compute, the cache-resident kernel rate
// peak[{type, threads}] ÷ the same bytes. A missing bound prints "-".
func DecodeTable(rs []DecodeResult, bw map[int]float64, peak map[PeakKey]float64) string {
	var sb strings.Builder
	sb.WriteString("| type | threads | MiB/token | decode t/s | memory bound t/s | of memory bound | compute bound t/s | of compute bound | prefill t/s | prefill/decode |\n")
	sb.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	bound := func(rate float64, r DecodeResult) (string, string) {
		if rate <= 0 {
			return "-", "-"
		}
		b := rate / float64(r.WeightBytesPerToken)
		return fmt.Sprintf("%.2f", b), fmt.Sprintf("%.0f%%", 100*r.DecodeTokPerS/b)
	}
	for _, r := range rs {
		mb, mp := bound(bw[r.Threads], r)
		cb, cp := bound(peak[PeakKey{r.Type, r.Threads}], r)
		fmt.Fprintf(&sb, "| %s | %d | %.1f | %s | %s | %s | %s | %s | %s | %.1fx |\n", r.Type, r.Threads,
			float64(r.WeightBytesPerToken)/(1<<20), medianRange(r.DecodeTokPerS, r.Decode, 2), mb, mp, cb, cp,
			medianRange(r.PrefillTokPerS, r.Prefill, 1), r.PrefillSpeedup())
	}
	return sb.String()
}

// medianRange writes a median with the range of the runs it came from,
// "10.00 (9.00-14.00)", or the median alone for one run: the ratios
// beside it are the median's, and a mean would let one run slowed by
// the host move the figure.
func medianRange(median float64, runs []float64, prec int) string {
	if len(runs) < 2 {
		return strconv.FormatFloat(median, 'f', prec, 64)
	}
	return fmt.Sprintf("%.*f (%.*f-%.*f)", prec, median, prec, slices.Min(runs), prec, slices.Max(runs))
}
