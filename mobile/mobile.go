// Package mobile is tandem's facade for Android (and iOS) apps, bound with
// gomobile: `gomobile bind -target=android ./mobile` makes an .aar whose
// Java classes are mobile.Mobile (NewEngine), mobile.Engine and the
// mobile.TokenCallback interface an app implements in Kotlin or Java.
//
// The exported API uses only types gobind supports: structured values
// (the configuration, requests, results and statistics) travel as JSON
// strings, errors become Java exceptions carrying the Go messages, and
// tokens stream through TokenCallback. Underneath it is the runtime's
// scheduler (runtime/sched) over CPU lanes, the same as `tandem serve`.
package mobile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

// Engine runs one model for an app: its requests are scheduled over the
// configured CPU lanes. All methods are safe to call from any thread.
type Engine struct {
	f          *weights.File
	tok        *tokenizer.Tokenizer
	sc         *sched.Scheduler
	closeLanes func() error
	maxTokens  int
	model      string // what Stats names
	memory     string
	spec       map[string]*sched.SpecEngine // speculative lanes by name

	mu        sync.Mutex
	inflight  map[string]context.CancelFunc // Generate and Resume calls by request id
	nextID    uint64
	closed    bool
	closeErr  error
	closeDone chan struct{} // closed when the first Close has finished
}

// NewEngine loads a model and starts its scheduler. configJSON is a JSON
// object; every field is optional ("" or "{}" runs the embedded default
// model):
//
//	model        absolute path of a GGUF or llama2.c model in the app's
//	             private files (Context.getFilesDir()); "": the embedded
//	             default model
//	tokenizer    tokenizer.bin or GGUF vocabulary ("": the model's own)
//	calibration  uncertainty calibration ("": MODEL.calib.json if present;
//	             the embedded model's own for the embedded model)
//	budget       bytes of weights each lane holds: "" (the whole file,
//	             mapped), "auto" (half the available memory, leaving the
//	             rest to the app: the low-memory killer ends apps that
//	             grow too far), "min", or a size like "512MiB"
//	threads      kernel threads of one lane (0: a thread per big core,
//	             or per physical core where they are alike)
//	lanes        threads per lane, e.g. [3,1]: the first lane is the
//	             primary, the second takes long requests, or short ones
//	             when it is much slower (not with threads)
//	lane_cpus    CPUs of each lane, e.g. ["big","little"]: "big" (every
//	             core but the slowest cluster's), "little" (the slowest
//	             cluster), a CPU list like "4-7", or "" (the OS places
//	             it); a pinned lane computes only there. Alone, it makes
//	             a lane per entry with a thread per CPU
//	context      tokens per sequence (0: the model's)
//	max_seqs     sequence slots per lane (default 8)
//	max_batch    sequences a lane decodes together (default 4)
//	max_tokens   for requests without max_tokens (default 256)
//	max_queue    requests that may wait for a lane (default 256); more
//	             fail with "queue full": retry after a moment
//	kv_type      "f32" (default) or "f16"
//	prefix_cache KV memory a lane keeps finished requests' rows in ("256MiB"; "0": none beyond live)
//	policy       tandem (default), fifo, luf, edf or rtlm
//	draft        a draft model for speculative decoding (same output,
//	             fewer passes of the model: pays when the model streams
//	             from flash); "default" is the embedded draft
//	draft_tokenizer  the draft's vocabulary if not in its file
//	mode         "tree" (default) or "sd", with a draft
//	draft_context  the draft's KV positions per sequence (0: its own);
//	             past them it drafts from the latest tokens
//
// Loading maps the model file; call it off the UI thread.
func NewEngine(configJSON string) (*Engine, error) {
	var c config
	if err := decodeJSON(configJSON, &c, "config"); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("mobile: config: %w", err)
	}
	specs, err := c.lanes()
	if err != nil {
		return nil, fmt.Errorf("mobile: config: %w", err)
	}
	kvt, err := c.kvType()
	if err != nil {
		return nil, fmt.Errorf("mobile: config: %w", err)
	}
	policy, err := sched.ParsePolicy(c.Policy)
	if err != nil {
		return nil, fmt.Errorf("mobile: config: policy: %w", err)
	}
	keep, err := c.prefixCache()
	if err != nil {
		return nil, fmt.Errorf("mobile: config: %w", err)
	}
	lopt := sched.LaneOptions{Lanes: specs, MaxSeqs: c.MaxSeqs, Context: c.Context, KVType: kvt,
		NoPrefixReuse: c.PrefixReuse != nil && !*c.PrefixReuse, PrefixCache: keep}
	f, err := openModel(c.Model)
	if err != nil {
		return nil, fmt.Errorf("mobile: %w", err)
	}
	e, err := start(f, &c, lopt, policy)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mobile: %w", err)
	}
	return e, nil
}

// start builds the engine on the open model f, its lanes as lopt says
// (start adds the weights' streaming and the draft).
func start(f *weights.File, c *config, lopt sched.LaneOptions, policy sched.Policy) (*Engine, error) {
	tok, err := openTokenizer(f, c.Tokenizer)
	if err != nil {
		return nil, err
	}
	est, err := openEstimator(c.Calibration, c.Model)
	if err != nil {
		return nil, err
	}
	mem, err := planMemory(f, c.Budget, len(lopt.Lanes))
	if err != nil {
		return nil, err
	}
	lopt.Stream = mem.Stream
	var draft *weights.File
	if c.Draft != "" {
		if draft, err = openDraft(c, tok, f.Path); err != nil {
			return nil, err
		}
		lopt.Draft, lopt.Spec, lopt.DraftContext = draft, specConfig(c.Mode), c.DraftContext
	}
	lanes, closeLanes, err := sched.LoadLanes(f, lopt)
	if err != nil {
		if draft != nil {
			draft.Close()
		}
		return nil, err
	}
	if draft != nil {
		// The lanes' models read the draft's mapping: it closes after them.
		closeModels := closeLanes
		closeLanes = func() error { return errors.Join(closeModels(), draft.Close()) }
	}
	sc, err := sched.New(sched.Config{Policy: policy, MaxBatch: c.MaxBatch, MaxQueue: c.MaxQueue, DefaultMaxTokens: c.MaxTokens}, est, lanes...)
	if err != nil {
		closeLanes()
		return nil, err
	}
	name := c.Model
	if name == "" {
		name = f.Path
	}
	specLanes := map[string]*sched.SpecEngine{}
	for _, l := range lanes {
		if se, ok := l.Engine.(*sched.SpecEngine); ok {
			specLanes[l.Name] = se
		}
	}
	return &Engine{f: f, tok: tok, sc: sc, closeLanes: closeLanes, maxTokens: c.MaxTokens, model: name,
		memory: mem.Note, spec: specLanes, inflight: map[string]context.CancelFunc{}, closeDone: make(chan struct{})}, nil
}

// TrimMemory gives back the KV memory the lanes hold beyond the running
// and parked requests' (finished requests' rows kept for prefix reuse,
// and buffers earlier peaks left) and returns the bytes released. Call
// it from Android's onTrimMemory: nothing running is touched, and later
// requests only prefill what the kept rows would have saved. The Go
// runtime returns the freed memory to the system at once.
func (e *Engine) TrimMemory() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := e.sc.TrimMemory(ctx)
	if err != nil {
		return n, fmt.Errorf("mobile: trim memory: %w", err)
	}
	debug.FreeOSMemory()
	return n, nil
}

// Close cancels the requests in flight (their Generate calls return with
// finish "cancelled"), drops parked ones, stops the lanes and releases the
// model. Calling it again does nothing and returns the first call's error.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.closeDone // the first call's work
		return e.closeErr
	}
	e.closed = true
	for _, cancel := range e.inflight {
		cancel()
	}
	e.mu.Unlock()
	// Cancelled requests end at the next step; the bound only matters if
	// a step hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := errors.Join(e.sc.Shutdown(ctx), e.closeLanes(), e.f.Close())
	if err != nil {
		err = fmt.Errorf("mobile: close: %w", err)
	}
	e.closeErr = err // read by later calls after closeDone
	close(e.closeDone)
	return err
}

// Stats returns the scheduler's counters and each lane's state as JSON:
// requests admitted, completed, cancelled, deadline hits and misses,
// generated tokens, KV memory per lane, and how the memory budget was
// resolved. Times are in milliseconds.
func (e *Engine) Stats() string {
	st := e.sc.Stats()
	e.mu.Lock()
	inflight := len(e.inflight)
	closed := e.closed
	e.mu.Unlock()
	out := statsJSON{Model: e.model, Memory: e.memory, Context: e.sc.Context(), Closed: closed, InFlight: inflight,
		Policy: st.Policy, UptimeMs: ms(st.Uptime), Waiting: st.Waiting, StalledMs: ms(st.Stalled), Parked: st.Parked,
		Admitted: st.Admitted, Rejected: st.Rejected, Completed: st.Completed, Cancelled: st.Cancelled,
		Failed: st.Failed, Segments: st.Segment, DeadlineHits: st.DeadlineHits, DeadlineMisses: st.DeadlineMisses,
		ShedRequests: st.ShedRequests, ShedTokens: st.ShedTokens, Evicted: st.Evicted, Expired: st.Expired,
		Tokens: st.Tokens, Attended: st.Attended, ReusedTokens: st.ReusedTokens, Utility: st.Utility, SchedulerMs: ms(st.SchedulerWall), EngineMs: ms(st.EngineWall)}
	for _, l := range st.Lanes {
		lj := laneJSON{Name: l.Name, Threads: l.Threads, CPUs: l.CPUs.String(), Running: l.Running, Waiting: l.Waiting,
			Parked: l.Parked, Sequences: l.Sequences, MaxSeqs: l.MaxSeqs, KVBytes: l.KVBytes, KVHeldBytes: l.KVHeldBytes, Steps: l.Steps,
			Tokens: l.Tokens, ReusedTokens: l.ReusedTokens, MuchSlower: l.MuchSlower,
			WeightsReadBytes: l.WeightsRead, WeightsPeakBytes: l.WeightsPeak,
			BusyMs: ms(l.Busy), StepMs: ms(l.StepTime), TokenMs: ms(l.TokenTime)}
		if se := e.spec[l.Name]; se != nil {
			ss := se.Stats()
			lj.Spec = &specJSON{Method: ss.Method, Tokens: ss.Emitted, TargetPasses: ss.TargetPasses,
				TokensPerPass: ss.TokensPerPass(), Acceptance: ss.AcceptanceRate(), Undrafted: ss.Undrafted, Slides: ss.Slides}
		}
		out.Lanes = append(out.Lanes, lj)
	}
	b, err := json.Marshal(out)
	if err != nil {
		// Plain numbers and strings always marshal; say so if not.
		return fmt.Sprintf(`{"error":%q}`, err.Error())
	}
	return string(b)
}

type statsJSON struct {
	Model    string  `json:"model"`
	Memory   string  `json:"memory"`
	Context  int     `json:"context"`
	Closed   bool    `json:"closed"`
	InFlight int     `json:"in_flight"`
	Policy   string  `json:"policy"`
	UptimeMs float64 `json:"uptime_ms"`
	Waiting  int     `json:"waiting"`
	// StalledMs: how long requests have waited with every lane idle (0:
	// not now). Above a few seconds it is a scheduler bug; closing and
	// reopening the engine frees them.
	StalledMs      float64    `json:"stalled_ms"`
	Parked         int        `json:"parked"`
	Admitted       uint64     `json:"admitted"`
	Rejected       uint64     `json:"rejected"`
	Completed      uint64     `json:"completed"`
	Cancelled      uint64     `json:"cancelled"`
	Failed         uint64     `json:"failed"`
	Segments       uint64     `json:"segments"`
	DeadlineHits   uint64     `json:"deadline_hits"`
	DeadlineMisses uint64     `json:"deadline_misses"`
	ShedRequests   uint64     `json:"shed_requests"`
	ShedTokens     uint64     `json:"shed_tokens"`
	Evicted        uint64     `json:"evicted"`
	Expired        uint64     `json:"expired"`
	Tokens         uint64     `json:"tokens"`
	Attended       uint64     `json:"attended_tokens"` // Σ over tokens of the context each followed: over tokens, the mean context
	ReusedTokens   uint64     `json:"reused_tokens"`   // prompt tokens taken from finished requests' KV rows (prefix reuse)
	Utility        float64    `json:"utility"`
	SchedulerMs    float64    `json:"scheduler_ms"`
	EngineMs       float64    `json:"engine_ms"`
	Lanes          []laneJSON `json:"lanes"`
}

type laneJSON struct {
	Name      string `json:"name"`
	Threads   int    `json:"threads"`
	CPUs      string `json:"cpus,omitempty"` // the CPUs a pinned lane computes on, as a list like 4-7
	Running   int    `json:"running"`
	Waiting   int    `json:"waiting"`
	Parked    int    `json:"parked"`
	Sequences int    `json:"sequences"`
	MaxSeqs   int    `json:"max_seqs"`
	KVBytes   int64  `json:"kv_bytes"`
	// KVHeldBytes is all the KV memory the lane holds, with freed
	// sequences kept for prefix reuse or the next request.
	KVHeldBytes int64  `json:"kv_held_bytes"`
	Steps       uint64 `json:"steps"`
	Tokens      uint64 `json:"tokens"`
	// ReusedTokens: prompt tokens taken from finished requests' KV rows.
	ReusedTokens uint64 `json:"reused_tokens"`
	// WeightsReadBytes and WeightsPeakBytes: on a lane streaming its
	// weights under the budget, the bytes it has read from the model file
	// and the most weight memory it has held.
	WeightsReadBytes uint64 `json:"weights_read_bytes,omitempty"`
	WeightsPeakBytes uint64 `json:"weights_peak_bytes,omitempty"`
	// MuchSlower: over 1.5 times slower per token than the fastest lane
	// (little cores beside big ones), so it is routed short requests.
	MuchSlower bool    `json:"much_slower"`
	BusyMs     float64 `json:"busy_ms"`
	StepMs     float64 `json:"step_ms"`
	TokenMs    float64 `json:"token_ms"`
	// Spec is what the draft saved, on a speculative lane.
	Spec *specJSON `json:"speculative,omitempty"`
}

type specJSON struct {
	Method        string  `json:"method"`
	Tokens        int     `json:"tokens"`
	TargetPasses  int     `json:"target_passes"`
	TokensPerPass float64 `json:"tokens_per_target_pass"`
	Acceptance    float64 `json:"acceptance_rate"`
	// Undrafted are target passes over the root alone: drafting paused
	// while it did not pay.
	Undrafted int `json:"undrafted_passes"`
	// Slides are the times the draft's window moved on past its
	// context (draft_context).
	Slides int `json:"draft_window_slides"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
