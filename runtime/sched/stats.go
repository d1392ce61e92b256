package sched

import (
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// counters are the scheduler's running totals; s.mu guards them.
type counters struct {
	admitted, rejected                    uint64
	completed, cancelled, failed, segment uint64
	deadlineHits, deadlineMisses          uint64
	shedRequests, shedTokens              uint64
	deferred, evicted, expired            uint64
	preempted                             uint64
	affine                                uint64
	freeErrors                            uint64
	stallWakes                            uint64
	utility                               float64
	schedWall                             time.Duration // outside the lanes (Submit, Resume, ...); lanes count their own
}

// record counts a finished stream.
func (s *Scheduler) record(r *Result) {
	switch r.Reason {
	case ReasonCancelled:
		s.stats.cancelled++
	case ReasonError:
		s.stats.failed++
	case ReasonSegment:
		s.stats.segment++
	default:
		s.stats.completed++
	}
	if r.HasDeadline && r.Reason != ReasonCancelled && r.Reason != ReasonError {
		if r.DeadlineMet {
			s.stats.deadlineHits++
		} else {
			s.stats.deadlineMisses++
		}
	}
	s.stats.shedTokens += uint64(r.ShedTokens)
	s.stats.utility += r.Utility
}

// Stats is a snapshot of the scheduler for metrics and benchmarks.
type Stats struct {
	Policy  string
	Uptime  time.Duration
	Waiting int // queued requests
	Parked  int // parked segmented requests (with or without KV)
	// Stalled is how long requests have waited while every lane sat idle
	// (0: not now). Planning should never leave them so; a stall that
	// lasts is a scheduler bug, and tandem serve's /healthz reports it.
	Stalled time.Duration
	// StallWakes counts the times requests waited a second or more with
	// every lane idle and the lanes were woken for them (watchStall).
	// Each is a scheduler bug worth reporting; the request then ran.
	StallWakes uint64

	Admitted, Rejected                    uint64 // Submit/Resume accepted, refused with ErrQueueFull
	Completed, Cancelled, Failed, Segment uint64 // streams ended by reason group
	DeadlineHits, DeadlineMisses          uint64
	ShedRequests, ShedTokens              uint64
	Deferred                              uint64 // admissions postponed by admission control
	Preempted                             uint64 // running requests sent back to the queue for a deadline
	Evicted, Expired                      uint64 // parked KV evicted under memory pressure; parked requests dropped
	Tokens                                uint64 // generated tokens, all lanes
	// Attended sums, over the generated tokens, the context each was
	// computed from (prompt and earlier answer): Attended ÷ Tokens is the
	// mean context, which sets how much attention a token costs and so
	// why the same lanes decode slower on long answers.
	Attended uint64
	// ReusedTokens counts context tokens that new sequences took from
	// freed ones' KV rows instead of prefilling them (prefix reuse, see
	// ModelEngine), all lanes. Affine counts requests routed to the lane
	// holding most of their context (see Scheduler.affinity).
	ReusedTokens, Affine uint64
	Utility              float64
	// OfferedLoad is the recent arrival rate of predicted tokens over the
	// lanes' full-batch capacity: above 1 the scheduler is overloaded and
	// sheds optional tokens early.
	OfferedLoad float64

	// SchedulerWall is the time spent in the scheduler's own code: the
	// wall time of planning and delivering (a lane waits meanwhile) and
	// the CPU time of scoring, which runs beside the lanes on the
	// submitting goroutine (wall time where there is no thread CPU
	// clock). EngineWall is the wall time in Engine.Step.
	SchedulerWall, EngineWall time.Duration
	// IntakeWall is the part of SchedulerWall outside the lanes:
	// scoring and queueing requests, resumes and cancellations, on the
	// callers' goroutines. The rest is the lanes' (LaneStats).
	IntakeWall time.Duration

	Lanes []LaneStats
}

// prefixReuser is an engine that reuses freed sequences' KV rows
// (ModelEngine, SpecEngine): ReusedTokens counts what it took, Reusable
// says what a Start would take. Both are safe from any goroutine.
type prefixReuser interface {
	ReusedTokens() int64
	Reusable(prompt, generated []int32) int
}

// kvHolder is an engine that says how much KV memory it holds beyond its
// live sequences' (kept and spare buffers), from any goroutine.
type kvHolder interface{ KVBytesHeld() int64 }

// speculator is an engine that decodes speculatively (SpecEngine):
// both methods are safe from any goroutine.
type speculator interface {
	Stats() spec.Stats
	Passes() int64
}

// SpecLaneStats are a speculative lane's counters, over every sequence
// it has decoded.
type SpecLaneStats struct {
	// Passes are target passes; a step verifies all its members' trees in
	// one. Rounds are draft-and-verify rounds, one per sequence a pass
	// verified.
	Passes int64
	Rounds int
	// Drafted tokens the target checked, and how many it accepted.
	Drafted, Accepted int
	// Undrafted are rounds whose pass verified the root alone: drafting
	// paused while it did not pay (spec.CostAware).
	Undrafted int
	// Slides are the times a draft's window moved on past its context
	// (spec.Stats.Slides).
	Slides int
}

// weightStreamer is an engine whose model may stream its weights
// (ModelEngine, SpecEngine's target): StreamStats is safe from any
// goroutine, ok false when the weights are resident.
type weightStreamer interface {
	StreamStats() (st weights.StreamStats, ok bool)
}

// kvTrimmer is an engine that can give back the KV memory it holds
// beyond its live sequences (ModelEngine, SpecEngine), from the
// goroutine that steps it.
type kvTrimmer interface {
	TrimKV() (int64, error)
}

// LaneStats describes one lane.
type LaneStats struct {
	Name      string
	Running   int
	Waiting   int // in the lane's own queue (routed policies)
	Parked    int // parked sequences holding KV here
	Sequences int // allocated sequences
	MaxSeqs   int
	KVBytes   int64 // KV memory of the allocated sequences
	// KVHeldBytes is the KV memory the lane's engine holds: KVBytes and
	// the buffers of freed sequences it keeps for prefix reuse or for the
	// next sequence (KVBytes for an engine that does not say).
	KVHeldBytes int64
	Steps       uint64
	Tokens      uint64 // generated on this lane
	// ReusedTokens: context tokens not prefilled thanks to prefix reuse.
	ReusedTokens uint64
	// WeightsRead and WeightsPeak: when the lane's model streams its
	// weights under a budget, the bytes it has read from the file and the
	// most weight memory it has held (pinned groups and the window's
	// loaded slots; between passes a window may hold none); zero when the
	// file is mapped whole, or before the lane's first pass.
	WeightsRead uint64
	WeightsPeak uint64
	// MuchSlower: the lane's time per token at full batch is over 1.5
	// times the fastest lane's, so routing sends it short requests
	// without deadlines instead of long ones (see Config.TauQuantile).
	MuchSlower bool
	EngineWall time.Duration
	// SchedulerWall is the wall time of the lane's locked sections
	// (delivering its steps and planning the next).
	SchedulerWall time.Duration
	Busy          time.Duration // clock time inside steps
	BatchCap      int           // most members it admits now (batchCap: MaxBatch, or fewer for recent deadlines)
	StepTime      time.Duration // the cost model's current step time at the current batch
	TokenTime     time.Duration // η: time per token per member at the current batch
	// Spec is the lane's speculative decoding, nil where it decodes
	// with the model alone.
	Spec     *SpecLaneStats
	Threads  int
	CPUs     cpuset.Set // the CPUs the lane computes on, when pinned (nil: placed by the OS)
	Context  int
	SeqBytes int64 // KV bytes per sequence
}

// Stats returns a snapshot.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.stats
	st := Stats{
		Policy: s.cfg.Policy.String(), Uptime: s.cfg.Now().Sub(s.started),
		Waiting: s.waitingCount(), Parked: len(s.parked),
		Admitted: c.admitted, Rejected: c.rejected,
		Completed: c.completed, Cancelled: c.cancelled, Failed: c.failed, Segment: c.segment,
		DeadlineHits: c.deadlineHits, DeadlineMisses: c.deadlineMisses,
		ShedRequests: c.shedRequests, ShedTokens: c.shedTokens, Deferred: c.deferred, Preempted: c.preempted,
		Evicted: c.evicted, Expired: c.expired, Utility: c.utility, Affine: c.affine, StallWakes: c.stallWakes,
		SchedulerWall: c.schedWall, IntakeWall: c.schedWall,
		OfferedLoad: s.offeredRatio(s.cfg.Now()),
	}
	if !s.stallSince.IsZero() && st.Waiting > 0 && s.allIdle() {
		st.Stalled = s.cfg.Now().Sub(s.stallSince)
	}
	for i, l := range s.lanes {
		st.Tokens += l.tokens
		st.Attended += l.attended
		st.SchedulerWall += l.schedWall
		st.EngineWall += l.engineWall
		ls := LaneStats{Name: l.name, Running: len(l.running), Parked: len(l.parked), Sequences: l.held,
			MaxSeqs: l.info.MaxSeqs, KVBytes: int64(l.held) * l.info.SeqBytes, Steps: l.steps, Tokens: l.tokens,
			EngineWall: l.engineWall, SchedulerWall: l.schedWall, Busy: l.stepClock, StepTime: l.cost.step(max(len(l.running), 1), 0),
			TokenTime: l.cost.perToken(max(len(l.running), 1)), Threads: l.info.Threads, CPUs: l.cpus, Context: l.info.Context,
			SeqBytes: l.info.SeqBytes, BatchCap: s.batchCap(l, s.cfg.Now())}
		if len(s.queues) > 1 {
			ls.Waiting = len(s.queues[i])
		}
		if r, ok := l.eng.(prefixReuser); ok {
			ls.ReusedTokens = uint64(r.ReusedTokens())
			st.ReusedTokens += ls.ReusedTokens
		}
		ls.KVHeldBytes = ls.KVBytes
		if h, ok := l.eng.(kvHolder); ok {
			ls.KVHeldBytes = h.KVBytesHeld()
		}
		if w, ok := l.eng.(weightStreamer); ok {
			if ws, ok := w.StreamStats(); ok {
				ls.WeightsRead, ls.WeightsPeak = ws.BytesRead, ws.Peak
			}
		}
		if sp, ok := l.eng.(speculator); ok {
			ss := sp.Stats()
			ls.Spec = &SpecLaneStats{Passes: sp.Passes(), Rounds: ss.TargetPasses, Drafted: ss.Verified, Accepted: ss.Accepted, Undrafted: ss.Undrafted, Slides: ss.Slides}
		}
		_, ls.MuchSlower = s.muchSlower(l)
		st.Lanes = append(st.Lanes, ls)
	}
	return st
}

// RetryAfter estimates when a queue slot frees: the time for the lanes to
// work through one batch of the waiting requests' predicted tokens.
func (s *Scheduler) RetryAfter() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total float64
	for _, q := range s.queues {
		for _, t := range q {
			total += remaining(t)
		}
	}
	per := total / float64(max(s.waitingCount(), 1)) // one request's tokens
	var rate float64                                 // tokens per second, all lanes
	for _, l := range s.lanes {
		rate += float64(s.cfg.MaxBatch) / l.cost.step(s.cfg.MaxBatch, 0).Seconds() * l.cost.tokPerStep
	}
	if rate <= 0 {
		return time.Second
	}
	d := time.Duration(per * float64(s.cfg.MaxBatch) / rate * float64(time.Second))
	return min(max(d, time.Second), time.Minute)
}
