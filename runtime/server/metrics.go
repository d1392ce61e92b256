package server

import (
	"fmt"
	"io"
	"net/http"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// snapshot is a scrape-time snapshot, kept for the rates /metrics reports.
type snapshot struct {
	at     time.Time
	tokens uint64
	busy   []time.Duration // per lane
}

// rateWindow is the span rates are measured over (or since the oldest
// scrape, when scrapes are further apart).
const rateWindow = 10 * time.Second

// metrics writes the Prometheus text exposition format by hand (the
// format is a few lines per metric; no client library needed).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m := &promWriter{w: w}
	b := s.ready.Load()
	m.gauge("tandem_up", "1 when the model is loaded and requests are served.", boolf(b != nil && !s.closing.Load()))
	s.mu.Lock()
	codes := make([]int, 0, len(s.byCode))
	for c := range s.byCode {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	m.help("tandem_http_responses_total", "counter", "HTTP responses by status code.")
	for _, c := range codes {
		m.value("tandem_http_responses_total", fmt.Sprintf(`code="%d"`, c), float64(s.byCode[c]))
	}
	s.mu.Unlock()
	mem := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(mem)
	m.help("tandem_memory_bytes", "gauge", "Memory: Go runtime total and live heap, the KV caches of allocated sequences (kv), and all the KV memory the lanes hold (kv_held: with the freed sequences kept for prefix reuse or the next request).")
	m.value("tandem_memory_bytes", `kind="go_total"`, float64(mem[0].Value.Uint64()))
	m.value("tandem_memory_bytes", `kind="go_heap"`, float64(mem[1].Value.Uint64()))
	if b == nil {
		return
	}
	st := b.sc.Stats()
	var kv, held int64
	for _, l := range st.Lanes {
		kv, held = kv+l.KVBytes, held+l.KVHeldBytes
	}
	m.value("tandem_memory_bytes", `kind="kv"`, float64(kv))
	m.value("tandem_memory_bytes", `kind="kv_held"`, float64(held))

	tokRate, busy := s.rates(st)
	m.gauge("tandem_queue_depth", "Requests waiting for a lane.", float64(st.Waiting))
	m.gauge("tandem_parked_requests", "Segmented requests parked until resumed.", float64(st.Parked))
	m.gauge("tandem_scheduler_stalled_seconds", "How long requests have waited with every lane idle (0: not now; above a few seconds, a scheduler bug).", st.Stalled.Seconds())
	m.counter("tandem_scheduler_stall_wakes_total", "Times requests waited a second with every lane idle and the lanes were woken for them (each a scheduler bug: please report it).", float64(st.StallWakes))
	m.gauge("tandem_offered_load", "Recent arrival rate of predicted tokens over the lanes' full-batch capacity (above 1: overload, optional tokens are shed).", st.OfferedLoad)
	m.counter("tandem_requests_admitted_total", "Requests and resumes accepted into the queue.", float64(st.Admitted))
	m.counter("tandem_requests_rejected_total", "Requests refused with 429 because the queue was full.", float64(st.Rejected))
	m.help("tandem_requests_finished_total", "counter", "Finished streams by outcome (segment: a segment ended and the request parked).")
	for _, kv := range []struct {
		k string
		v uint64
	}{{"completed", st.Completed}, {"segment", st.Segment}, {"cancelled", st.Cancelled}, {"failed", st.Failed}} {
		m.value("tandem_requests_finished_total", `outcome="`+kv.k+`"`, float64(kv.v))
	}
	m.counter("tandem_deadline_hits_total", "Requests with a deadline that finished by it.", float64(st.DeadlineHits))
	m.counter("tandem_deadline_misses_total", "Requests with a deadline that finished after it.", float64(st.DeadlineMisses))
	m.counter("tandem_utility_total", "Sum of the time-utility of finished requests.", st.Utility)
	m.counter("tandem_shed_requests_total", "Requests ended early under overload after their min_tokens.", float64(st.ShedRequests))
	m.counter("tandem_shed_tokens_total", "Optional tokens not generated because of shedding.", float64(st.ShedTokens))
	m.counter("tandem_admissions_deferred_total", "Times admission control kept a request waiting to protect a deadline.", float64(st.Deferred))
	m.counter("tandem_preempted_total", "Running requests sent back to the queue to make room for a deadline.", float64(st.Preempted))
	m.counter("tandem_kv_evictions_total", "Parked or preempted sequences whose KV cache was evicted for a slot (rebuilt by prefill when they run again).", float64(st.Evicted))
	m.counter("tandem_parked_expired_total", "Parked requests dropped after the park TTL.", float64(st.Expired))
	m.counter("tandem_tokens_generated_total", "Generated tokens, all lanes.", float64(st.Tokens))
	m.counter("tandem_attended_tokens_total", "Sum over generated tokens of the context each followed; over tandem_tokens_generated_total, the mean context, which sets what attention costs a token (long answers decode slower).", float64(st.Attended))
	m.counter("tandem_prefix_reused_tokens_total", "Prompt tokens not prefilled because a freed sequence's KV cache already held them (prefix reuse: a chat's earlier turns, a shared instruction).", float64(st.ReusedTokens))
	m.counter("tandem_prefix_routed_total", "Requests routed to the lane that keeps most of their context (a conversation's next turn), whatever their predicted length.", float64(st.Affine))
	m.gauge("tandem_tokens_per_second", "Generated tokens per second over the last 10 seconds.", tokRate)
	m.counter("tandem_scheduler_seconds_total", "Time spent in the scheduler's own code (planning and delivery in wall time, scoring in CPU time).", st.SchedulerWall.Seconds())
	m.counter("tandem_engine_seconds_total", "Wall time spent in engine steps.", st.EngineWall.Seconds())

	m.help("tandem_lane_info", "gauge", "Always 1; each lane's kernel threads and the CPUs they are pinned to (cpus=\"\": placed by the OS).")
	for _, l := range st.Lanes {
		m.value("tandem_lane_info", lane(l)+`,threads="`+strconv.Itoa(l.Threads)+`",cpus="`+l.CPUs.String()+`"`, 1)
	}
	m.help("tandem_lane_utilization", "gauge", "Fraction of the last 10 seconds each lane spent in steps.")
	for i, l := range st.Lanes {
		m.value("tandem_lane_utilization", lane(l), busy[i])
	}
	// tandem_lane_spec_* are the speculative lanes' alone (serve --draft).
	specLanes := slices.DeleteFunc(slices.Clone(st.Lanes), func(l sched.LaneStats) bool { return l.Spec == nil })
	for _, g := range []struct {
		name, help string
		val        func(sched.LaneStats) float64
	}{ // gauges, and by Prometheus' naming a _total is a counter
		{"tandem_lane_running", "Sequences in each lane's batch.", func(l sched.LaneStats) float64 { return float64(l.Running) }},
		{"tandem_lane_batch_cap", "Most sequences each lane admits now: --max-batch, or fewer while recent deadlines need shorter steps.", func(l sched.LaneStats) float64 { return float64(l.BatchCap) }},
		{"tandem_lane_sequences", "Allocated sequences (running, parked, resumed) per lane.", func(l sched.LaneStats) float64 { return float64(l.Sequences) }},
		{"tandem_lane_max_sequences", "Sequence slots per lane.", func(l sched.LaneStats) float64 { return float64(l.MaxSeqs) }},
		{"tandem_lane_kv_bytes", "KV memory of the allocated sequences per lane.", func(l sched.LaneStats) float64 { return float64(l.KVBytes) }},
		{"tandem_lane_kv_held_bytes", "KV memory each lane holds: its allocated sequences' and the freed ones kept for prefix reuse or the next request.", func(l sched.LaneStats) float64 { return float64(l.KVHeldBytes) }},
		{"tandem_lane_step_seconds", "Predicted step time at the current batch (the lane's cost model).", func(l sched.LaneStats) float64 { return l.StepTime.Seconds() }},
		{"tandem_lane_steps_total", "Engine steps per lane.", func(l sched.LaneStats) float64 { return float64(l.Steps) }},
		{"tandem_lane_waiting", "Requests waiting in each lane's own queue (with two or more lanes; routing picks the queue).", func(l sched.LaneStats) float64 { return float64(l.Waiting) }},
		{"tandem_lane_tokens_generated_total", "Generated tokens per lane.", func(l sched.LaneStats) float64 { return float64(l.Tokens) }},
		{"tandem_lane_prefix_reused_tokens_total", "Prompt tokens each lane took from freed sequences' KV caches instead of prefilling them.", func(l sched.LaneStats) float64 { return float64(l.ReusedTokens) }},
		{"tandem_lane_much_slower", "1 for a lane over 1.5 times slower per token than the fastest: it is routed short requests without deadlines, not long ones.", func(l sched.LaneStats) float64 {
			if l.MuchSlower {
				return 1
			}
			return 0
		}},
		{"tandem_lane_weights_read_bytes_total", "Weight bytes each lane has read from the model file (0 where the weights are resident; with --budget they stream every pass).", func(l sched.LaneStats) float64 { return float64(l.WeightsRead) }},
		{"tandem_lane_weights_peak_bytes", "Most weight memory each streamed lane has held (pinned groups and loaded window slots; 0 where the file is mapped whole).", func(l sched.LaneStats) float64 { return float64(l.WeightsPeak) }},
		{"tandem_lane_scheduler_seconds_total", "Wall time of each lane's scheduler sections (delivering a step and planning the next); tandem_scheduler_seconds_total less their sum is the intake's.", func(l sched.LaneStats) float64 { return l.SchedulerWall.Seconds() }},
		{"tandem_lane_spec_passes_total", "Target passes of each speculative lane; one verifies every member's tree.", func(l sched.LaneStats) float64 { return float64(l.Spec.Passes) }},
		{"tandem_lane_spec_rounds_total", "Draft-and-verify rounds of each speculative lane, one per sequence a pass verified.", func(l sched.LaneStats) float64 { return float64(l.Spec.Rounds) }},
		{"tandem_lane_spec_drafted_tokens_total", "Drafted tokens the target checked.", func(l sched.LaneStats) float64 { return float64(l.Spec.Drafted) }},
		{"tandem_lane_spec_accepted_tokens_total", "Drafted tokens the target accepted.", func(l sched.LaneStats) float64 { return float64(l.Spec.Accepted) }},
		{"tandem_lane_spec_undrafted_rounds_total", "Rounds that verified the root alone: drafting paused while it did not pay.", func(l sched.LaneStats) float64 { return float64(l.Spec.Undrafted) }},
		{"tandem_lane_spec_draft_window_slides_total", "Times a draft's window moved on past its context (--draft-ctx, or a draft with a shorter context than the model's).", func(l sched.LaneStats) float64 { return float64(l.Spec.Slides) }},
	} {
		lanes := st.Lanes
		if strings.HasPrefix(g.name, "tandem_lane_spec_") {
			if lanes = specLanes; len(lanes) == 0 {
				continue
			}
		}
		kind := "gauge"
		if strings.HasSuffix(g.name, "_total") {
			kind = "counter"
		}
		m.help(g.name, kind, g.help)
		for _, l := range lanes {
			m.value(g.name, lane(l), g.val(l))
		}
	}
}

func lane(l sched.LaneStats) string { return `lane="` + strings.ReplaceAll(l.Name, `"`, `'`) + `"` }

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// rates compares st with the newest sample at least rateWindow old (or
// the oldest kept) and returns tokens per second and each lane's busy
// fraction.
func (s *Server) rates(st sched.Stats) (float64, []float64) {
	now := time.Now()
	cur := snapshot{at: now, tokens: st.Tokens}
	for _, l := range st.Lanes {
		cur.busy = append(cur.busy, l.Busy)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Keep the newest sample at least a window old and the ones after it.
	for len(s.samples) > 1 && now.Sub(s.samples[1].at) >= rateWindow {
		s.samples = s.samples[1:]
	}
	base := cur
	if len(s.samples) > 0 {
		base = s.samples[0]
	}
	s.samples = append(s.samples, cur)
	if n := len(s.samples); n > 256 { // scraped very often: thin the middle
		s.samples = append(s.samples[:1], s.samples[n-255:]...)
	}
	busy := make([]float64, len(cur.busy))
	dt := now.Sub(base.at).Seconds()
	if dt <= 0 {
		return 0, busy
	}
	for i := range busy {
		if i < len(base.busy) {
			busy[i] = min(1, (cur.busy[i]-base.busy[i]).Seconds()/dt)
		}
	}
	return float64(cur.tokens-base.tokens) / dt, busy
}

type promWriter struct{ w io.Writer }

func (p *promWriter) help(name, typ, help string) {
	fmt.Fprintf(p.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *promWriter) value(name, labels string, v float64) {
	if labels != "" {
		fmt.Fprintf(p.w, "%s{%s} %v\n", name, labels, v)
		return
	}
	fmt.Fprintf(p.w, "%s %v\n", name, v)
}

func (p *promWriter) gauge(name, help string, v float64) {
	p.help(name, "gauge", help)
	p.value(name, "", v)
}

func (p *promWriter) counter(name, help string, v float64) {
	p.help(name, "counter", help)
	p.value(name, "", v)
}
