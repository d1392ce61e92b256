package sched

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// SeqID names a sequence inside one Engine.
type SeqID int

// Engine is one lane's compute backend: a model with its own threads and
// KV cache. The plain engine (ModelEngine) runs one model.Forward per
// step; a speculative engine (runtime/spec) may give several tokens per
// step; a GPU backend plugs in the same way.
//
// Used by the scheduler's lane goroutine only: no two methods of one
// Engine are ever called at the same time. Another scheduler may use the
// same engine once the first one's Shutdown has returned (this package's
// engines are claimed by New to enforce that).
type Engine interface {
	// Info describes the engine; the scheduler reads it once.
	Info() EngineInfo

	// Start allocates a sequence whose context is tokens. They are
	// evaluated by the next Steps (prefill, in chunks), after which each
	// Step yields new tokens picked by sampler. tokens may be a prompt or,
	// to rebuild an evicted sequence, a prompt and the tokens generated
	// so far (the last of them not yet evaluated). tag names the request
	// (the simulator uses it; engines may ignore it). It fails when every
	// sequence slot is in use. tokens belong to the caller: Start copies
	// what it keeps and modifies nothing.
	Start(tokens []int32, sampler *sample.Sampler, tag string) (SeqID, error)

	// Step advances every member once. out[i] receives member i's result:
	// a member still prefilling may yield no token; one that is decoding
	// yields at least one and at most members[i].Limit. Step returns an
	// error only when the whole step failed; a failure of one member goes
	// in its StepOut.Err and the others continue.
	Step(ctx context.Context, members []Member, out []StepOut) error

	// Free releases a sequence and its KV memory at once.
	Free(id SeqID) error
}

// owner is embedded by this package's engines. A scheduler claims each
// of its lanes' engines in New and gives them back when Shutdown
// returns: a second scheduler over an engine still in use (whose lane
// goroutine would call it at the same time as the first's) is refused
// by New, where it would otherwise corrupt the engine's KV cache.
type owner struct{ by atomic.Pointer[Scheduler] }

func (o *owner) claim(s *Scheduler) bool { return o.by.CompareAndSwap(nil, s) }
func (o *owner) release(s *Scheduler)    { o.by.CompareAndSwap(s, nil) }

// claimable is an engine that a scheduler claims (owner).
type claimable interface {
	claim(*Scheduler) bool
	release(*Scheduler)
}

// EngineInfo is what the scheduler needs to know about an engine.
type EngineInfo struct {
	Name     string
	MaxSeqs  int   // sequence slots (running and parked together)
	Context  int   // tokens per sequence, prompt and output together
	Vocab    int   // token ids run from 0 to Vocab-1 (0: not known; Start checks them)
	SeqBytes int64 // KV memory one sequence holds
	Threads  int
	// CPUs are the CPUs the engine's kernel threads are pinned to (a
	// phone's big or little cores), or nil. The lane's goroutine, which
	// computes a share of every kernel, pins itself to them too.
	CPUs cpuset.Set
}

// Member is a sequence in a step.
type Member struct {
	Seq   SeqID
	Limit int // the most tokens it may yield this step (>= 1)
}

// StepOut is what a step did for one member.
type StepOut struct {
	Tokens []int32 // new tokens, at most Limit (the slice is reused by the next Step)
	// Prefilled counts the prompt (or rebuilt context) tokens evaluated
	// this step; 0 when the member decoded. The cost model charges a step
	// per decoding member and per prefilled token, so a decode reported
	// as one prefilled token hides every member's cost from it.
	Prefilled int
	// Reused counts context tokens this step took from another live
	// sequence's rows instead of evaluating them (a sequence that waited
	// while another evaluated the instructions they share); negative when
	// a failed copy undid what its Start reused. Start's own reuse is in
	// the engine's ReusedTokens only.
	Reused int
	Err    error // this member failed (its sequence stays allocated until Free)
}

// stepCost describes a step for the cost model.
type stepCost struct {
	decode  int // members that yielded tokens
	prefill int // context tokens evaluated
	dur     time.Duration
}
