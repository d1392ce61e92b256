// Package sched serves several local clients from one model: it orders
// their requests, batches them through an Engine, and keeps deadlines.
//
// A request's path: Submit scores its prompt (the uncertainty estimate u,
// a predicted output length: linguistic features and prompt length
// through a small MLP, see Estimator), routes it to a lane (long requests
// to the secondary lane, see Config.TauQuantile; short ones, when the
// secondary is much slower) and queues it. Each lane
// is a goroutine that repeats one step: plan (drop cancelled work, shed
// optional tokens under overload, take waiting requests into the batch in
// priority order with dynamic consolidation and admission control, up to
// a batch size that leaves recent deadlines reachable), run
// Engine.Step once for every member, then deliver the new tokens to the
// members' Streams. Members join and leave between steps (continuous
// batching). A request with a segment delimiter is parked when a segment
// completes: its KV cache stays in the engine until Resume (or is evicted
// under memory pressure and rebuilt by prefill).
//
// The scheduler takes its clock and engines as values (Config.Now,
// Lane.Engine), so tests run on a fake clock and the benchmark's
// discrete-event simulator drives the same code through Begin, Step.Run
// and End with a simulated engine.
package sched

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Sentinel errors; callers test them with errors.Is.
var (
	// ErrQueueFull: the waiting queue is at Config.MaxQueue. Retry after
	// the duration RetryAfter reports.
	ErrQueueFull = errors.New("sched: queue full")
	// ErrClosed: the scheduler is shutting down or closed.
	ErrClosed = errors.New("sched: shutting down")
	// ErrInvalid: the request is malformed (the message says which field).
	ErrInvalid = errors.New("sched: invalid request")
	// ErrIDInUse: Submit was given the id of a request that is generating
	// or parked. It matches ErrInvalid too.
	ErrIDInUse = errors.New("sched: request id in use")
	// ErrNotParked: Resume or Discard named no parked request.
	ErrNotParked = errors.New("sched: no parked request with that id")
	// ErrBusy: Resume named a request that is still generating.
	ErrBusy = errors.New("sched: request is still generating")
	// ErrContextFull: the prompt does not fit the engine's context.
	ErrContextFull = errors.New("sched: prompt does not fit the context")
	// ErrEngineInUse: New was given an engine that another scheduler (or
	// another of its lanes) holds; Shutdown that scheduler first.
	ErrEngineInUse = errors.New("sched: engine is in use by another scheduler until its Shutdown returns")
)

// Policy orders waiting requests.
type Policy int

const (
	// Tandem: normalised RT-LM priority (1-α·û)/max(slack, min) with
	// aging, lane routing by the τ quantile, dynamic consolidation,
	// admission control, preemption and a batch cap for deadlines, and
	// shedding of optional tokens.
	Tandem Policy = iota
	// FIFO serves requests in arrival order from one queue shared by all
	// lanes (what local engines do today).
	FIFO
	// LUF (least uncertainty first) serves the smallest predicted output
	// length first from one shared queue.
	LUF
	// EDF serves the earliest deadline first (d = r + φ·prompt length
	// for requests without one) from one shared queue.
	EDF
	// RTLM is RT-LM as published: priority (1-α·u)/(d-r-η·u) with raw
	// token counts, computed once at arrival, lane routing and
	// consolidation, no admission control or shedding. With raw counts
	// the numerator turns negative for long requests, so their order
	// flips; the benchmark shows the effect.
	RTLM
)

var policyNames = [...]string{Tandem: "tandem", FIFO: "fifo", LUF: "luf", EDF: "edf", RTLM: "rtlm"}

func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Policies lists every policy, tandem's first.
func Policies() []Policy { return []Policy{Tandem, FIFO, LUF, EDF, RTLM} }

// ParsePolicy reads a policy name (tandem, fifo, luf, edf, rtlm).
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(s, n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("sched: unknown policy %q; want one of %s", s, strings.Join(policyNames[:], ", "))
}

// Config tunes the scheduler. Zero values take the defaults named on each
// field; Ablate switches parts of the Tandem policy off for comparisons.
type Config struct {
	Policy Policy

	// MaxBatch (C) is the most sequences one lane steps together
	// (default 8).
	MaxBatch int
	// Lookahead (b): consolidation looks at the b·C most urgent waiting
	// requests (default 2).
	Lookahead float64
	// Lambda (λ): consolidation cuts the u-sorted candidates where u grows
	// by more than λ× from one to the next (default 4).
	Lambda float64
	// Alpha (α) weighs the uncertainty in the priority numerator 1-α·û
	// (default 0.5; the RTLM policy uses α/u_max on raw counts).
	Alpha float64
	// Phi (φ) sets the implicit deadline of a request without one,
	// d = r + φ·prompt tokens (default: 8 decode steps per prompt token
	// at the lane's measured speed).
	Phi time.Duration
	// MinSlack clamps the slack in the priority denominator (default:
	// 2 decode steps at the lane's measured speed).
	MinSlack time.Duration
	// TauQuantile (k): requests scored above this quantile of recent
	// scores go to the secondary lane (default 0.9). A secondary lane more
	// than 1.5 times slower than the primary at full batch is routed the
	// shortest requests without deadlines instead, up to its share of the
	// work.
	TauQuantile float64
	// MaxQueue bounds the waiting requests; Submit fails with
	// ErrQueueFull beyond it (default 256).
	MaxQueue int
	// MaxParked bounds the parked segmented requests, with or without a
	// KV cache (default 256).
	MaxParked int
	// ParkTTL drops a parked request not resumed within it (default 10m).
	ParkTTL time.Duration
	// DefaultMaxTokens bounds requests with MaxTokens 0 (default: the
	// engine's context).
	DefaultMaxTokens int

	// Now is the clock (default time.Now). Tests and the simulator set it.
	Now func() time.Time
	// Manual leaves lane goroutines unstarted: the caller drives each lane
	// with Begin, Step.Run and End (the simulator does).
	Manual bool

	// Ablate turns parts of the Tandem policy off (for the benchmark).
	Ablate Ablation
}

// Ablation switches off parts of the Tandem policy.
type Ablation struct {
	NoRouting       bool // one shared queue instead of τ-quantile lanes
	NoConsolidation bool // take candidates in priority order without the λ cut
	NoAdmission     bool // no deadline-based admission control (nor preemption or a batch cap for deadlines)
	NoShedding      bool // never shed optional tokens
	NoAging         bool // priority from the arrival time, not the current time
}

func (c *Config) defaults() {
	if c.MaxBatch <= 0 {
		c.MaxBatch = 8
	}
	// The checks are written so that NaN takes the default too.
	if !(c.Lookahead >= 1) || math.IsInf(c.Lookahead, 1) {
		c.Lookahead = 2
	}
	if !(c.Lambda > 1) {
		c.Lambda = 4 // +Inf stays: never cut
	}
	if !(c.Alpha > 0 && c.Alpha < 1) {
		c.Alpha = 0.5
	}
	if !(c.TauQuantile > 0 && c.TauQuantile < 1) {
		c.TauQuantile = 0.9
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 256
	}
	if c.MaxParked <= 0 {
		c.MaxParked = 256
	}
	if c.ParkTTL <= 0 {
		c.ParkTTL = 10 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// features says which mechanisms the configured policy uses.
type features struct {
	routing, consolidation, admission, shedding, aging bool
}

func (c *Config) features() features {
	switch c.Policy {
	case Tandem:
		return features{
			routing:       !c.Ablate.NoRouting,
			consolidation: !c.Ablate.NoConsolidation,
			admission:     !c.Ablate.NoAdmission,
			shedding:      !c.Ablate.NoShedding,
			aging:         !c.Ablate.NoAging,
		}
	case RTLM:
		return features{routing: true, consolidation: true}
	}
	return features{}
}

// idInUse is Submit's error for an id that is taken: it matches both
// ErrIDInUse and ErrInvalid, and says what to do.
type idInUse struct{ msg string }

func (e *idInUse) Error() string { return "sched: invalid request: " + e.msg }

func (e *idInUse) Is(target error) bool { return target == ErrIDInUse || target == ErrInvalid }
