package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// StreamConfig is one configuration of the streaming benchmark.
type StreamConfig struct {
	// Mode is "resident" (the whole mapped file, no budget), "std" or
	// "stdpl" (weights.StreamStd, weights.StreamPipelined).
	Mode   string
	Budget uint64 // bytes; ignored for resident
	// Bandwidth emulates storage of that many bytes/s; 0 reads the real
	// disk, whose bandwidth DiskBW gives the bound.
	Bandwidth float64
	Method    weights.IOMethod
	Threads   int
	// Runs runs of Tokens decode tokens each are measured (defaults 5 and
	// 2), after a warm-up token. A run's latency is its time ÷ Tokens:
	// with a read-ahead window one token's reads can happen during the
	// one before, so a single token's time says little; a run's does.
	Runs, Tokens int
	// DiskBW is the measured cold-read bandwidth of the disk (bytes/s),
	// the bound's denominator when Bandwidth is 0.
	DiskBW float64
}

// StreamResult is one configuration measured.
type StreamResult struct {
	Config     StreamConfig
	Model      string
	Type       string
	TotalBytes uint64          // bytes of the streamed groups (all weights but norms)
	Pinned     uint64          // bytes pinned (all of TotalBytes for resident)
	Streamed   uint64          // bytes read per token, as planned
	Read       uint64          // bytes read per measured token, as counted
	Token      time.Duration   // median over runs of the per-token latency
	RunTimes   []time.Duration // per-token latency of each run
	// Bound is the IO lower bound per token: Streamed / bandwidth.
	Bound time.Duration
	// Stall, ReadTime and Compute are per token (totals over the measured
	// tokens ÷ tokens): compute waiting for IO, the reader's busy time,
	// and time between acquiring and releasing groups.
	Stall, ReadTime, Compute time.Duration
	PeakResident             uint64 // the streamer's peak weight bytes
	// PeakRSS is the process's peak resident set during the configuration,
	// BaseRSS its resident set before the model was opened (the binary,
	// the Go runtime), KVBytes the KV cache's size.
	PeakRSS, BaseRSS, KVBytes uint64
	Tokens                    []int32 // the greedy tokens, for the cross-mode check
}

// Ratio is the per-token latency over the IO bound (0 with no bound).
func (r StreamResult) Ratio() float64 {
	if r.Bound <= 0 {
		return 0
	}
	return float64(r.Token) / float64(r.Bound)
}

// Bandwidth is the storage bandwidth the bound uses.
func (r StreamResult) Bandwidth() float64 {
	if r.Config.Bandwidth > 0 {
		return r.Config.Bandwidth
	}
	return r.Config.DiskBW
}

// Storage names the storage the configuration read from.
func (r StreamResult) Storage() string {
	if r.Config.Bandwidth > 0 {
		return fmt.Sprintf("%.0f MB/s", r.Config.Bandwidth/1e6)
	}
	return fmt.Sprintf("disk (%.0f MB/s)", r.Config.DiskBW/1e6)
}

// Overhead is peak RSS beyond the weights the streamer held: KV cache,
// activations, buffers, the binary and the runtime.
func (r StreamResult) Overhead() int64 {
	return int64(r.PeakRSS) - int64(r.PeakResident)
}

// DiskBandwidth measures how fast the disk delivers path cold: the page
// cache is dropped first and behind every 4 MiB read, as the Streamer
// reads. At most limit bytes are read. The file is synced first: dirty
// pages of a freshly written model cannot be dropped, and their
// writeback would compete with every read measured after.
func DiskBandwidth(path string, limit int64) (float64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	if err := fh.Sync(); err != nil {
		return 0, fmt.Errorf("bench: sync %s: %w", path, err)
	}
	if err := weights.DropPageCache(path); err != nil {
		return 0, err
	}
	st, err := fh.Stat()
	if err != nil {
		return 0, err
	}
	n := min(st.Size(), limit)
	buf := make([]byte, 4<<20)
	start := time.Now()
	for off := int64(0); off < n; off += int64(len(buf)) {
		k := min(int64(len(buf)), n-off)
		if _, err := fh.ReadAt(buf[:k], off); err != nil {
			return 0, fmt.Errorf("bench: read %s: %w", path, err)
		}
	}
	bw := float64(n) / time.Since(start).Seconds()
	return bw, weights.DropPageCache(path)
}

// Stream measures greedy decode of the model at path under cfg: the page
// cache is dropped, the model loaded (pinned groups read), one token
// prefilled and one decoded to warm up, then cfg.Runs runs of cfg.Tokens
// tokens decoded one Forward each; the per-token latency is the median
// over runs.
func Stream(path string, cfg StreamConfig) (StreamResult, error) {
	cfg.Runs = cmp(cfg.Runs, 5)
	cfg.Tokens = cmp(cfg.Tokens, 2)
	res := StreamResult{Config: cfg, Model: path}
	if err := weights.DropPageCache(path); err != nil {
		return res, err
	}
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS()
	res.BaseRSS = currentRSS()

	f, err := weights.Open(path)
	if err != nil {
		return res, err
	}
	defer f.Close()
	_, res.Type = WeightBytesPerToken(f)
	opt := model.Options{Threads: cfg.Threads}
	sopt := weights.StreamOptions{Budget: cfg.Budget, Method: cfg.Method, Throttle: weights.Throttle{Bandwidth: cfg.Bandwidth}}
	switch cfg.Mode {
	case "resident":
	case "std":
		sopt.Mode = weights.StreamStd
		opt.Stream = &sopt
	case "stdpl":
		sopt.Mode = weights.StreamPipelined
		opt.Stream = &sopt
	default:
		return res, fmt.Errorf("bench: mode %q: want resident, std or stdpl", cfg.Mode)
	}
	probe, groups, err := model.PlanStream(f, sopt)
	if err != nil && probe.Total == 0 {
		return res, err
	}
	res.TotalBytes = probe.Total
	m, err := model.Load(f, opt)
	if err != nil {
		return res, err
	}
	defer m.Close()
	if opt.Stream != nil {
		st, _ := m.StreamStats()
		res.Pinned = st.Pinned
	} else {
		res.Pinned = res.TotalBytes
	}
	if opt.Stream != nil {
		p, _, _ := model.PlanStream(f, sopt)
		res.Streamed = p.Streamed(groups, f)
	}
	if bw := res.Bandwidth(); bw > 0 {
		res.Bound = time.Duration(float64(res.Streamed) / bw * float64(time.Second))
	}

	mc := m.Config()
	cache, err := m.NewCache(mc.Context, weights.F32)
	if err != nil {
		return res, err
	}
	kc := cache.Config()
	res.KVBytes = uint64(2 * kc.Layers * kc.KVDim * kc.Context * 4)
	seq, err := cache.NewSeq()
	if err != nil {
		return res, err
	}
	var b model.Batch
	var out model.Logits
	if need := 2 + cfg.Runs*cfg.Tokens; need > mc.Context {
		return res, fmt.Errorf("bench: %d tokens exceed the model's context of %d", need, mc.Context)
	}
	step := func(tok int32) (int32, error) {
		b.Reset()
		b.Add(tok, int32(cache.Len(seq)), seq, -1, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			return 0, err
		}
		if err := cache.CommitAll(seq); err != nil {
			return 0, err
		}
		tok = argmax(out.Row(0))
		res.Tokens = append(res.Tokens, tok)
		return tok, nil
	}
	tok := int32(1)          // BOS
	for i := 0; i < 2; i++ { // the prefill and one warm-up decode
		if tok, err = step(tok); err != nil {
			return res, err
		}
	}
	before, _ := m.StreamStats()
	var secs []float64
	for r := 0; r < cfg.Runs; r++ {
		start := time.Now()
		for i := 0; i < cfg.Tokens; i++ {
			if tok, err = step(tok); err != nil {
				return res, err
			}
		}
		d := time.Since(start) / time.Duration(cfg.Tokens)
		res.RunTimes = append(res.RunTimes, d)
		secs = append(secs, d.Seconds())
	}
	n := time.Duration(cfg.Runs * cfg.Tokens)
	res.Token = time.Duration(Median(secs) * float64(time.Second))
	if after, ok := m.StreamStats(); ok {
		// Bytes the measured tokens consumed: what the reader had read
		// ahead when a counter was taken belongs to the token after it.
		res.Read = ((after.BytesRead - after.Ahead) - (before.BytesRead - before.Ahead)) / uint64(cfg.Runs*cfg.Tokens)
		res.Stall = (after.Stall - before.Stall) / n
		res.ReadTime = (after.ReadTime - before.ReadTime) / n
		var c time.Duration
		for i := range after.Groups {
			c += after.Groups[i].Compute - before.Groups[i].Compute
		}
		res.Compute = c / n
		res.PeakResident = after.Peak
	} else {
		res.Compute = res.Token
		res.PeakResident = res.TotalBytes
	}
	res.PeakRSS = peakRSS()
	return res, nil
}

// StreamTable formats results as a markdown table, each row next to its
// IO bound.
func StreamTable(rs []StreamResult) string {
	var sb strings.Builder
	sb.WriteString("| type | storage | mode | budget | pinned | read/token | ms/token | IO bound ms | of bound | stall ms | compute ms | reads MB/s | peak RSS | overhead |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		budget, bound, ratio, rate := "-", "-", "-", "-"
		if r.ReadTime > 0 {
			rate = fmt.Sprintf("%.0f", float64(r.Read)/r.ReadTime.Seconds()/1e6)
		}
		if r.Config.Mode != "resident" {
			budget = fmt.Sprintf("%.0f%% (%s)", 100*float64(r.Config.Budget)/float64(r.TotalBytes), progress.Bytes(r.Config.Budget))
		}
		if r.Bound > 0 {
			bound = fmt.Sprintf("%.0f", ms(r.Bound))
			ratio = fmt.Sprintf("%.2fx", r.Ratio())
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %.0f | %.0f | %s | %s | %s |\n",
			r.Type, r.Storage(), r.Config.Mode, budget, progress.Bytes(r.Pinned), progress.Bytes(r.Streamed),
			ms(r.Token), bound, ratio, ms(r.Stall), ms(r.Compute), rate, progress.Bytes(r.PeakRSS), signedBytes(r.Overhead()))
	}
	return sb.String()
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

func signedBytes(n int64) string {
	if n < 0 {
		return "-" + progress.Bytes(uint64(-n))
	}
	return progress.Bytes(uint64(n))
}

// StreamGoals checks the goals on results of one model type and
// says in a few lines how each went.
func StreamGoals(rs []StreamResult) string {
	var sb strings.Builder
	var resident time.Duration
	for _, r := range rs {
		if r.Config.Mode == "resident" {
			resident = r.Token
		}
	}
	type key struct {
		bw     float64
		budget uint64
	}
	std := map[key]StreamResult{}
	for _, r := range rs {
		if r.Config.Mode == "std" {
			std[key{r.Config.Bandwidth, r.Config.Budget}] = r
		}
	}
	for _, r := range rs {
		if r.Config.Mode != "stdpl" {
			continue
		}
		ioBound := r.Bound > resident
		verdict := "compute-bound (IO bound below the resident latency)"
		if ioBound {
			verdict = "IO-bound: goal <= 1.15x: "
			if r.Ratio() <= 1.15 {
				verdict += "met"
			} else {
				verdict += "MISSED"
			}
		}
		line := fmt.Sprintf("- %s, %s, budget %.0f%%: stdpl %.2fx of its IO bound, %s", r.Type, r.Storage(),
			100*float64(r.Config.Budget)/float64(r.TotalBytes), r.Ratio(), verdict)
		if s, ok := std[key{r.Config.Bandwidth, r.Config.Budget}]; ok {
			line += fmt.Sprintf("; std - stdpl = %.0f ms (stdpl computes %.0f ms/token)", ms(s.Token-r.Token), ms(r.Compute))
		}
		sb.WriteString(line + "\n")
	}
	return sb.String()
}

// SameTokens reports the first result whose greedy tokens differ from
// the first result's (every mode must decode the same tokens).
func SameTokens(rs []StreamResult) error {
	for _, r := range rs[min(1, len(rs)):] {
		n := min(len(r.Tokens), len(rs[0].Tokens))
		if !slices.Equal(r.Tokens[:n], rs[0].Tokens[:n]) {
			return fmt.Errorf("bench: %s %s at budget %d decoded %v, %s decoded %v", r.Config.Mode, r.Storage(), r.Config.Budget, r.Tokens, rs[0].Config.Mode, rs[0].Tokens)
		}
	}
	return nil
}

// StreamPlot draws per-token latency against budget for one model type:
// a line per mode and storage, the IO bound of each storage dashed, and
// the resident latency at 100%.
func StreamPlot(rs []StreamResult, title string) []byte {
	c := Chart{Title: title, XLabel: "budget (% of the model's weights)", YLabel: "ms per token (median)", YFromZero: true}
	type key struct {
		mode string
		bw   float64
	}
	var order []key
	lines := map[key]*Series{}
	add := func(k key, name string, dashed bool, x, y float64) {
		s, ok := lines[k]
		if !ok {
			s = &Series{Name: name, Dashed: dashed}
			lines[k] = s
			order = append(order, k)
		}
		s.X, s.Y = append(s.X, x), append(s.Y, y)
	}
	var resident *StreamResult
	for i, r := range rs {
		if r.Config.Mode == "resident" {
			resident = &rs[i]
			continue
		}
		x := 100 * float64(r.Config.Budget) / float64(r.TotalBytes)
		add(key{r.Config.Mode, r.Config.Bandwidth}, r.Config.Mode+", "+r.Storage(), false, x, ms(r.Token))
		if r.Config.Mode == "stdpl" {
			add(key{"bound", r.Config.Bandwidth}, "IO bound, "+r.Storage(), true, x, ms(r.Bound))
		}
	}
	if resident != nil {
		add(key{"resident", 0}, "resident (all in memory)", false, 100, ms(resident.Token))
	}
	// Colour by storage, so a mode's line and its bound match.
	colors := map[float64]string{}
	for _, k := range order {
		if _, ok := colors[k.bw]; !ok {
			colors[k.bw] = palette[len(colors)%len(palette)]
		}
		s := lines[k]
		s.Color = colors[k.bw]
		if k.mode == "std" {
			s.Dashed = false
			s.Color = shade(s.Color)
		}
		if k.mode == "resident" {
			s.Color = "#000000"
		}
		c.Series = append(c.Series, *s)
	}
	return c.SVG()
}

// shade darkens a #rrggbb colour, telling std from stdpl on one storage.
func shade(c string) string {
	var r, g, b int
	if _, err := fmt.Sscanf(c, "#%02x%02x%02x", &r, &g, &b); err != nil {
		return c
	}
	return fmt.Sprintf("#%02x%02x%02x", r*3/5, g*3/5, b*3/5)
}
