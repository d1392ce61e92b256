package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/internal/budget"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/sysmem"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// runMode is one value of --mode: how the model's weights are held and
// whether a draft model speculates for it.
type runMode struct {
	name string
	help string
	// stream says the weights stream under --budget, in streamMode.
	stream     bool
	streamMode weights.StreamMode
	// budgeted modes stream (pipelined) when --budget is given and are
	// resident otherwise.
	budgeted bool
	// speculative modes need --draft and decode with spec.Method.
	speculative bool
	method      spec.Method
}

// runModes are the values of --mode. A new mode is one line here plus what
// generate does with it.
var runModes = []runMode{
	{name: "resident", help: "the model alone, computing on the whole mapped file (no budget)"},
	{name: "target", help: "the model alone: resident, or streamed (stdpl) under --budget", budgeted: true},
	{name: "std", help: "stream layers that are not pinned when needed, no overlap (the Std baseline)", stream: true, streamMode: weights.StreamStd},
	{name: "stdpl", help: "stream with the next layers read while one computes (the StdPL baseline)", stream: true, streamMode: weights.StreamPipelined},
	{name: "sd", help: "speculative decoding with --draft: a chain of --draft-len tokens, verified, repeated", budgeted: true, speculative: true, method: spec.SD},
	{name: "bild", help: "the Big-Little decoder with --draft (lossy: the draft runs until unsure, the model rolls back what it finds unlikely)", budgeted: true, speculative: true, method: spec.BiLD},
	{name: "tree", help: "token-tree speculative decoding with --draft: confidence-paced tree, one verification pass, draft works during IO (default with --draft)", budgeted: true, speculative: true, method: spec.Tree},
}

func modeNames() string {
	names := make([]string, len(runModes))
	for i, m := range runModes {
		names[i] = m.name
	}
	return strings.Join(names, "|")
}

// autoBudgetShare is the share of available memory --budget auto takes:
// the rest is headroom for the KV cache, activations, the binary and
// whatever else the device runs.
const autoBudgetShare = 0.6

// runFlags are the flags that say how a model runs: its memory budget, the
// mode and the storage it streams from. generate registers them; the
// spec-decoding modes extend them.
type runFlags struct {
	budget, mode, io, bandwidth, latency *string
	// available reports the memory --budget auto divides (a test seam).
	available func() (uint64, error)
}

func addRunFlags(fs *flag.FlagSet) *runFlags {
	var mh []string
	for _, m := range runModes {
		mh = append(mh, fmt.Sprintf("%s: %s", m.name, m.help))
	}
	return &runFlags{
		budget: fs.String("budget", "", "most bytes of model weights held in memory, like 512MiB, 1.5GB or 25% (of the weights); auto: "+
			fmt.Sprintf("%.0f%%", 100*autoBudgetShare)+" of available memory; min: the smallest the model allows (printed). Layers beyond it stream from the file"),
		mode:      fs.String("mode", "", "how the weights are held (default: tree with --draft or the embedded pair; else resident without --budget, stdpl with one; std and stdpl without --budget stream under auto):\n"+strings.Join(mh, "\n")),
		io:        fs.String("io", "pread", "how streamed weights are read: pread (into buffers tandem owns) or mmap (the file mapping)"),
		bandwidth: fs.String("io-bandwidth", "off", "emulate slower storage for streamed reads, like 400MB/s (eMMC) or 1.5GB/s (UFS); off: the disk's own speed"),
		latency:   fs.String("io-latency", "0", "emulated latency of each streamed read request, like 100us"),
		available: sysmem.Available,
	}
}

// runConfig is what the run flags resolve to for one model file.
type runConfig struct {
	mode   runMode
	stream *weights.StreamOptions // nil: resident
	plan   weights.StreamPlan
}

// resolve checks the run flags against the model f and returns how to load
// it. Notes for the user (the chosen budget, what it pins) go to stderr.
// draft says --draft was given (the default mode is then tree).
func (r *runFlags) resolve(f *weights.File, draft bool, stderr io.Writer) (runConfig, error) {
	var rc runConfig
	name := *r.mode
	if name == "" {
		name = "resident"
		if *r.budget != "" {
			name = "stdpl"
		}
		if draft {
			name = "tree"
		}
	}
	found := false
	for _, m := range runModes {
		if m.name == name {
			rc.mode, found = m, true
		}
	}
	if !found {
		return rc, fmt.Errorf("%w: --mode %q: want one of %s", errUsage, name, modeNames())
	}
	if rc.mode.speculative != draft {
		if draft {
			return rc, fmt.Errorf("%w: --mode %s runs the model alone; --draft needs --mode tree, sd or bild", errUsage, name)
		}
		return rc, fmt.Errorf("%w: --mode %s needs a draft model: add --draft FILE", errUsage, name)
	}
	if rc.mode.budgeted && *r.budget != "" {
		rc.mode.stream, rc.mode.streamMode = true, weights.StreamPipelined
	}
	var method weights.IOMethod
	switch *r.io {
	case "pread":
		method = weights.IOPread
	case "mmap":
		method = weights.IOMmap
	default:
		return rc, fmt.Errorf("%w: --io %q: want pread or mmap", errUsage, *r.io)
	}
	bw, err := parseBandwidth(*r.bandwidth)
	if err != nil {
		return rc, fmt.Errorf("%w: --io-bandwidth: %v", errUsage, err)
	}
	lat, err := time.ParseDuration(strings.TrimSpace(*r.latency))
	if err != nil || lat < 0 {
		return rc, fmt.Errorf("%w: --io-latency %q: want a duration like 100us or 2ms", errUsage, *r.latency)
	}
	if !rc.mode.stream {
		if *r.budget != "" || bw > 0 || lat > 0 || *r.io != "pread" {
			return rc, fmt.Errorf("%w: --mode %s computes on the whole mapped file; --budget, --io, --io-bandwidth and --io-latency need a streaming mode (--mode std or stdpl alone, tree, sd or bild with --draft)", errUsage, rc.mode.name)
		}
		return rc, nil
	}
	if f.Path == defaultModelName {
		return rc, fmt.Errorf("%w: --mode %s streams weights from a file; the embedded model has none: pass --model", errUsage, rc.mode.name)
	}
	opt := weights.StreamOptions{Mode: rc.mode.streamMode, Method: method, Throttle: weights.Throttle{Bandwidth: bw, Latency: lat}}
	// The plan at budget 0 fails but reports the total and the minimum.
	probe, _, err := model.PlanStream(f, opt)
	if err != nil && probe.Min == 0 {
		return rc, err
	}
	fm, err := budget.Parse(*r.budget, false)
	if err != nil {
		return rc, fmt.Errorf("%w: --%v", errUsage, err)
	}
	switch fm.Kind {
	case "min":
		opt.Budget = probe.Min
	case "", "auto":
		avail, err := r.available()
		if err != nil {
			return rc, fmt.Errorf("--budget auto: reading available memory: %w; give a size instead", err)
		}
		opt.Budget = uint64(float64(avail) * autoBudgetShare)
		fmt.Fprintf(stderr, "budget auto: %s (%.0f%% of %s available)\n", progress.Bytes(opt.Budget), 100*autoBudgetShare, progress.Bytes(avail))
	case "%":
		opt.Budget = uint64(float64(probe.Total) * fm.Share / 100)
	default:
		opt.Budget = fm.Size
	}
	plan, groups, err := model.PlanStream(f, opt)
	if err != nil {
		return rc, fmt.Errorf("%w; run with --budget min to use the smallest", err)
	}
	if fm.Kind == "min" {
		fmt.Fprintf(stderr, "budget min: %s for %s (%s of weights): %s\n", progress.Bytes(plan.Min), f.Path, progress.Bytes(plan.Total), describePlan(plan, groups))
	}
	rc.stream, rc.plan = &opt, plan
	return rc, nil
}

// describePlan says in a line what a plan pins and streams.
func describePlan(p weights.StreamPlan, groups []weights.Group) string {
	var pinned []string
	streamed := 0
	for i, g := range groups {
		switch {
		case p.Pinned[i]:
			pinned = append(pinned, g.Name)
		case !g.Rows:
			streamed++
		}
	}
	pin := "pins nothing"
	if len(pinned) > 0 {
		pin = fmt.Sprintf("pins %s (%s)", strings.Join(pinned, ", "), progress.Bytes(p.PinBytes))
	}
	return fmt.Sprintf("%s; streams %d groups through a %s window", pin, streamed, progress.Bytes(p.Window))
}

// streamStats are the streaming figures generate reports.
type streamStats struct {
	Mode              string  `json:"mode"`
	IO                string  `json:"io"`
	BudgetBytes       uint64  `json:"budget_bytes"`
	PinnedBytes       uint64  `json:"pinned_bytes"`
	WindowBytes       uint64  `json:"window_bytes"`
	ResidentBytes     uint64  `json:"resident_bytes"`
	PeakResidentBytes uint64  `json:"peak_resident_bytes"`
	WarmupReadBytes   uint64  `json:"warmup_read_bytes"`
	BytesRead         uint64  `json:"bytes_read"`
	Passes            int     `json:"passes"`
	BytesReadPerToken uint64  `json:"bytes_read_per_token"`
	ReadSeconds       float64 `json:"read_seconds"`
	IOStallSeconds    float64 `json:"io_stall_seconds"`
	IOBandwidth       float64 `json:"io_bandwidth_bytes_per_s,omitempty"`
}

// newStreamStats summarises a streamer's counters. A pass is one Forward:
// the prompt's prefill, then one per generated token.
func newStreamStats(st weights.StreamStats, opt *weights.StreamOptions) *streamStats {
	s := &streamStats{Mode: st.Mode.String(), IO: st.Method.String(), BudgetBytes: st.Budget, PinnedBytes: st.Pinned,
		WindowBytes: st.Window, ResidentBytes: st.Resident, PeakResidentBytes: st.Peak, WarmupReadBytes: st.WarmupRead,
		BytesRead: st.BytesRead, Passes: st.Passes, ReadSeconds: st.ReadTime.Seconds(), IOStallSeconds: st.Stall.Seconds(),
		IOBandwidth: opt.Throttle.Bandwidth}
	if st.Passes > 0 {
		s.BytesReadPerToken = st.BytesRead / uint64(st.Passes)
	}
	return s
}

func (s *streamStats) String() string {
	bw := "disk speed"
	if s.IOBandwidth > 0 {
		bw = fmt.Sprintf("emulated %.0f MB/s", s.IOBandwidth/1e6)
	}
	return fmt.Sprintf("%s/%s, budget %s: pinned %s, window %s, resident %s (peak %s) | read %s per token (%s), %.2fs reading, IO stall %.2fs",
		s.Mode, s.IO, progress.Bytes(s.BudgetBytes), progress.Bytes(s.PinnedBytes), progress.Bytes(s.WindowBytes),
		progress.Bytes(s.ResidentBytes), progress.Bytes(s.PeakResidentBytes), progress.Bytes(s.BytesReadPerToken), bw,
		s.ReadSeconds, s.IOStallSeconds)
}

// threadCount is a --threads flag, refused as it is parsed when it is
// negative or above kernels.MaxThreads: a typo of 100000 started as many
// spinning workers, and a negative count meant the default silently.
type threadCount int

func (t *threadCount) String() string { return strconv.Itoa(int(*t)) }

func (t *threadCount) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > kernels.MaxThreads {
		return fmt.Errorf("want 0 (a thread per physical core, or per big core on a phone) to %d", kernels.MaxThreads)
	}
	*t = threadCount(n)
	return nil
}

// threadsFlag defines --threads on fs.
func threadsFlag(fs interface {
	Var(flag.Value, string, string)
}) *int {
	n := new(int)
	fs.Var((*threadCount)(n), "threads", fmt.Sprintf("compute threads: `N` from 0 to %d (0: a thread per physical core, or per big core on a phone)", kernels.MaxThreads))
	return n
}
