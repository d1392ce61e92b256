package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/weights"
)

// ModelEngineOptions configures NewModelEngine.
type ModelEngineOptions struct {
	Name string
	// MaxSeqs is the sequence slots of the KV cache, running and parked
	// together (default 16).
	MaxSeqs int
	// Context is the tokens per sequence (0: the model's).
	Context int
	// KVType is weights.F32 (default) or weights.F16.
	KVType weights.DType
	// PrefillChunk is the most context tokens one step evaluates for
	// sequences still prefilling, all of them together (default 64). It
	// bounds how much a joining request slows the members already
	// decoding.
	PrefillChunk int
	// NoPrefixReuse turns off prefix reuse (see ModelEngine): every
	// sequence then prefills its whole context.
	NoPrefixReuse bool
	// PrefixCache is the KV memory in bytes the engine may fill with
	// finished sequences kept for prefix reuse (0: DefaultPrefixCache;
	// negative: none beyond the memory the most sequences live at once
	// took, which the engine holds anyway).
	PrefixCache int64
}

// DefaultPrefixCache is the KV memory a lane may fill with kept
// sequences when its options leave it zero: room for the conversations
// of a few clients taking turns on a small model, and for none beyond
// the sequences live at once on a large one (whose one sequence can take
// gigabytes).
const DefaultPrefixCache = 512 << 20

// ParsePrefixCache reads a prefix cache size for the PrefixCache options
// as a user writes it: a byte count like 256MiB or 1GB, where 0 means no
// memory beyond the sequences live at once (the options' -1).
func ParsePrefixCache(s string) (int64, error) {
	n, err := units.ParseSize(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w (or 0 to keep only what live sequences took)", err)
	case n == 0:
		return -1, nil
	case n > math.MaxInt64:
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(n), nil
}

// ModelEngine is the plain engine: one model.Forward per step with one
// root slot per decoding member and a chain per prefilling one, so a lane
// decodes its whole batch reading the weights once. It yields exactly one
// token per decoding member per step.
//
// Prefix reuse: a freed sequence keeps its KV rows, with the tokens they
// hold, in a slot that no request owns. A new sequence whose context
// starts with some of those tokens takes that slot, rolls it back to the
// common prefix and prefills only the rest: a chat's next turn (the
// conversation so far, resent whole), a planner's fixed instructions, or
// a parked sequence rebuilt after its eviction. The rows hold what a
// prefill would compute for the same tokens at the same positions, so
// the output is unchanged. Kept sequences count as free (Live,
// KVBytesInUse): a host cache keeps a freed sequence's buffer for reuse
// anyway, and a new sequence with nothing to reuse empties the oldest
// kept one before it takes memory for another, unless PrefixCache
// leaves room for one more: then a context sharing less with the best
// kept sequence than that sequence would lose starts in a new one, so
// that clients taking turns each keep their conversation. Live
// sequences' evaluated contexts are sources too, copied but never taken:
// clients that start together with the same instructions evaluate them
// once. A cache whose rows live on a GPU keeps them there the same way
// (TestCUDAPrefixReuse).
type ModelEngine struct {
	owner // claimed by the scheduler that runs it
	m     *model.Model
	cache *kv.Cache
	opt   ModelEngineOptions
	seqs  map[SeqID]*modelSeq
	live  atomic.Int64 // len(seqs), readable from any goroutine

	keptMu sync.Mutex // guards kept and open: the scheduler asks Reusable from any goroutine
	kept   []keptSeq  // freed sequences whose rows may be reused, oldest first
	// open are the live sequences' committed context rows, which a new
	// sequence may copy but not take.
	open   []keptSeq
	reuse  bool         // prefix reuse is on
	reused atomic.Int64 // context tokens not evaluated thanks to reuse
	held   atomic.Int64 // the cache's memory: sequences live, kept and spare
	// copyPrefix is kv.Cache.CopyPrefix; tests make it fail part way.
	copyPrefix func(c *kv.Cache, dst, src, n int) error

	batch  model.Batch
	logits model.Logits
	slot   []int // per member: the slot whose logits it samples, or -1
	eval   []int // per member: the pending tokens the step evaluates
	draws  []draw
}

// draw is one member's sampling in a step: its sequence, the slot whose
// logits it samples, and the token it drew.
type draw struct {
	seq  *modelSeq
	slot int
	tok  int32
}

// keptSeq is a sequence that holds the KV rows of tokens: a freed one
// kept for reuse, or a live one, whose rows hold its context's first
// tokens so far.
type keptSeq struct {
	id     int
	tokens []int32
}

type modelSeq struct {
	pending []int32 // context not yet evaluated: the prompt's rest, or the last sampled token
	history []int32 // every token of the sequence, for the repeat penalty
	context []int32 // the history's first tokens, given at Start
	// decoding: the context is evaluated and pending is the last sampled
	// token. Its evaluation is a decode step, not prefill progress: the
	// scheduler's cost model tells the two apart by StepOut.Prefilled.
	decoding bool
	sampler  *sample.Sampler
	out      [1]int32
}

// evaluated is how many of the context's tokens the sequence's rows hold
// while it prefills.
func (s *modelSeq) evaluated() int { return len(s.context) - len(s.pending) }

// NewModelEngine makes an engine on m with its own KV cache. m must not be
// used by anything else while the engine runs (its buffers are reused);
// give each lane its own Model loaded from the same weights.File.
func NewModelEngine(m *model.Model, opt ModelEngineOptions) (*ModelEngine, error) {
	if opt.MaxSeqs <= 0 {
		opt.MaxSeqs = 16
	}
	if opt.PrefillChunk <= 0 {
		opt.PrefillChunk = 64
	}
	if opt.KVType == 0 {
		opt.KVType = weights.F32
	}
	if opt.PrefixCache == 0 {
		opt.PrefixCache = DefaultPrefixCache
	}
	if opt.Name == "" {
		opt.Name = "cpu"
	}
	cache, err := m.NewCache(opt.Context, opt.KVType)
	if err != nil {
		return nil, fmt.Errorf("sched: engine %s: %w", opt.Name, err)
	}
	cfg := cache.Config()
	cfg.MaxSeqs = opt.MaxSeqs
	if cache, err = kv.New(cfg); err != nil {
		return nil, fmt.Errorf("sched: engine %s: %w", opt.Name, err)
	}
	return &ModelEngine{m: m, cache: cache, opt: opt, seqs: map[SeqID]*modelSeq{}, reuse: !opt.NoPrefixReuse,
		copyPrefix: (*kv.Cache).CopyPrefix}, nil
}

// Info implements Engine.
func (e *ModelEngine) Info() EngineInfo {
	cfg := e.cache.Config()
	return EngineInfo{Name: e.opt.Name, MaxSeqs: e.opt.MaxSeqs, Context: cfg.Context, Vocab: e.m.Config().Vocab,
		SeqBytes: cfg.SeqBytes(), Threads: e.m.Pool().Threads(), CPUs: e.m.Pool().CPUs()}
}

// Live is the number of allocated sequences. Safe to call from any
// goroutine (metrics, tests).
func (e *ModelEngine) Live() int { return int(e.live.Load()) }

// KVBytesInUse is the KV memory of the allocated sequences. Safe to call
// from any goroutine.
func (e *ModelEngine) KVBytesInUse() int64 { return e.live.Load() * e.cache.Config().SeqBytes() }

// ReusedTokens is how many context tokens new sequences took from freed
// ones instead of evaluating them (prefix reuse). Safe to call from any
// goroutine.
func (e *ModelEngine) ReusedTokens() int64 { return e.reused.Load() }

// KVBytesHeld is the KV memory the engine holds: its live sequences',
// and the buffers of freed ones kept for prefix reuse or for the next
// sequence. Safe to call from any goroutine.
func (e *ModelEngine) KVBytesHeld() int64 { return e.held.Load() }

// Start implements Engine.
func (e *ModelEngine) Start(tokens []int32, sampler *sample.Sampler, _ string) (SeqID, error) {
	if len(tokens) == 0 {
		return 0, fmt.Errorf("sched: engine %s: start: no tokens", e.opt.Name)
	}
	if ctx := e.cache.Config().Context; len(tokens) > ctx {
		return 0, fmt.Errorf("sched: engine %s: %d tokens exceed the context of %d: %w", e.opt.Name, len(tokens), ctx, ErrContextFull)
	}
	vocab := int32(e.m.Config().Vocab)
	for i, t := range tokens {
		if t < 0 || t >= vocab {
			return 0, fmt.Errorf("%w: token %d at %d is outside the vocabulary of %d", ErrInvalid, t, i, vocab)
		}
	}
	id, have, err := e.newSeq(tokens)
	if err != nil {
		return 0, fmt.Errorf("sched: engine %s: %w", e.opt.Name, err)
	}
	if sampler == nil {
		sampler = sample.New(sample.Options{})
	}
	hist := append(make([]int32, 0, len(tokens)+64), tokens...)
	ctx := hist[:len(tokens):len(tokens)]
	e.seqs[SeqID(id)] = &modelSeq{pending: ctx[have:], history: hist, context: ctx, sampler: sampler}
	if e.reuse {
		e.keptMu.Lock()
		e.open = append(e.open, keptSeq{id: id, tokens: ctx[:have]})
		e.keptMu.Unlock()
	}
	e.live.Add(1)
	e.reused.Add(int64(have))
	e.held.Store(e.cache.Bytes())
	return SeqID(id), nil
}

// newSeq finds a sequence for tokens as planStart says: a kept one rolled
// back to the prefix it shares, a kept or new one given another kept or
// a live one's first rows, or a new one (have: the tokens its rows
// hold). The last token is always evaluated again: its logits pick the
// first new token.
func (e *ModelEngine) newSeq(tokens []int32) (id, have int, err error) {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	p := e.plan(tokens, nil)
	if p.take < 0 {
		if id, err = e.cache.NewSeq(); err != nil {
			return 0, 0, err
		}
	} else {
		id = e.kept[p.take].id
	}
	if p.from >= 0 {
		err = e.copyPrefix(e.cache, id, e.source(p.from).id, p.have)
	} else {
		err = e.cache.Truncate(id, p.have)
	}
	if p.take >= 0 {
		e.kept = slices.Delete(e.kept, p.take, p.take+1)
	}
	if err != nil {
		// A copy that failed part way leaves rows that match no tokens:
		// the sequence goes, kept or new.
		e.cache.Free(id)
		return 0, 0, err
	}
	return id, p.have, nil
}

// plan is planStart over the kept sequences and the live ones' context
// rows (keptMu held).
func (e *ModelEngine) plan(prompt, generated []int32) startPlan {
	tokens := func(i int) []int32 { return e.source(i).tokens }
	return planStart(len(e.kept), len(e.open), tokens, prompt, generated, e.canGrow(), e.cache.CanCopy())
}

// source is planStart's source i: kept, then live (keptMu held).
func (e *ModelEngine) source(i int) keptSeq {
	if i < len(e.kept) {
		return e.kept[i]
	}
	return e.open[i-len(e.kept)]
}

// canGrow reports whether a new sequence may take memory beside the kept
// ones (keptMu held).
func (e *ModelEngine) canGrow() bool {
	return roomToKeep(int(e.live.Load())+len(e.kept), e.opt.MaxSeqs, e.cache.Config().SeqBytes(), e.opt.PrefixCache)
}

// roomToKeep reports whether a lane holding slots sequences (live and
// kept), each of seqBytes, may allocate one more and keep the ones it
// has: within maxSeqs, and within budget bytes (see
// ModelEngineOptions.PrefixCache, defaults resolved).
func roomToKeep(slots, maxSeqs int, seqBytes, budget int64) bool {
	return slots < maxSeqs && int64(slots+1)*seqBytes <= budget
}

// startPlan says where a new sequence starts.
type startPlan struct {
	take int // the kept sequence it takes, or -1 for a new one
	// from is the source whose first have rows it copies, or -1: take's
	// own. Below the kept count it is a kept sequence; from there on, a
	// live one (see planStart).
	from int
	have int // the context's first tokens it starts with rows for
}

// planStart plans the start of a sequence with context prompt followed by
// generated. Its sources are n kept sequences and then live ones
// (tokens(i): the tokens source i's committed rows hold; i < n for kept,
// n <= i < n+live for live). The kept one sharing the longest prefix (see
// longestKept) is taken, rolled back to it, when it shares at least as
// much as it would lose. Otherwise its rows are left for their own
// conversation's next turn: the context starts in a new sequence when
// grow allows one, else in an empty kept one, else in the oldest kept
// one, and copies the shared rows when canCopy (a GPU cache may not).
// Without grow and canCopy the best one is taken as before: memory stays
// what the most sequences live at once took. A live sequence sharing a
// longer prefix than any kept one (clients starting together with the
// same instructions) is never taken, only copied from, into a sequence
// found the same way.
func planStart(n, live int, tokens func(i int) []int32, prompt, generated []int32, grow, canCopy bool) startPlan {
	p := planKept(n, tokens, prompt, generated, grow, canCopy)
	if live == 0 || !canCopy {
		return p
	}
	lb, lh := longestKept(live, func(i int) []int32 { return tokens(n + i) }, prompt, generated)
	if lh <= p.have {
		return p
	}
	slot := emptyKept(n, tokens)
	if slot < 0 && !grow && n > 0 {
		slot = 0
	}
	return startPlan{take: slot, from: n + lb, have: lh}
}

// planKept is planStart among the kept sequences alone.
func planKept(n int, kept func(i int) []int32, prompt, generated []int32, grow, canCopy bool) startPlan {
	if n == 0 {
		return startPlan{take: -1, from: -1}
	}
	best, have := longestKept(n, kept, prompt, generated)
	if len(kept(best))-have <= have || (!grow && !canCopy) {
		return startPlan{take: best, from: -1, have: have}
	}
	slot := emptyKept(n, kept)
	if slot < 0 && !grow {
		slot = 0
	}
	switch {
	case slot == best:
		return startPlan{take: best, from: -1, have: have}
	case have > 0 && canCopy:
		return startPlan{take: slot, from: best, have: have}
	}
	return startPlan{take: slot, from: -1}
}

// emptyKept is the first of n kept sequences whose rows hold no tokens,
// or -1.
func emptyKept(n int, kept func(i int) []int32) int {
	for i := range n {
		if len(kept(i)) == 0 {
			return i
		}
	}
	return -1
}

// commonPrefix is how many leading tokens a and b share.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// prefixOver is how many leading tokens a shares with b followed by c.
func prefixOver(a, b, c []int32) int {
	n := commonPrefix(a, b)
	if n < len(b) {
		return n
	}
	return n + commonPrefix(a[n:], c)
}

// longestKept picks among n kept token lists (kept(i)) the one sharing
// the longest prefix with the context prompt followed by generated (the
// oldest, 0, when none shares any), and says how many of its tokens a
// start would take: at most all but the context's last, whose logits
// pick the first new token. Both engines' starts and Reusable use it.
func longestKept(n int, kept func(i int) []int32, prompt, generated []int32) (best, have int) {
	for i := range n {
		if m := prefixOver(kept(i), prompt, generated); m > have {
			best, have = i, m
		}
	}
	return best, min(have, max(len(prompt)+len(generated)-1, 0))
}

// Reusable is how many leading tokens of the context prompt followed by
// generated a Start would take from kept rows instead of prefilling them.
// The scheduler's admission control prices the rest, and routing sends a
// request where most of its context is kept. Safe to call from any
// goroutine.
func (e *ModelEngine) Reusable(prompt, generated []int32) int {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	return e.plan(prompt, generated).have
}

// StreamStats is the model's weight streaming counters (ok false when
// its weights are resident). Safe from any goroutine.
func (e *ModelEngine) StreamStats() (weights.StreamStats, bool) { return e.m.StreamStats() }

// TrimKV frees the kept sequences and the cache's spare buffers: the
// memory that prefix reuse and earlier peaks hold beyond the live
// sequences. Call it between steps, on the goroutine that steps the
// engine (Scheduler.TrimMemory does). It returns the bytes released.
func (e *ModelEngine) TrimKV() (int64, error) {
	before := e.cache.Bytes()
	e.keptMu.Lock()
	var errs []error
	for _, k := range e.kept {
		errs = append(errs, e.cache.Free(k.id))
	}
	e.kept = nil
	e.keptMu.Unlock()
	errs = append(errs, e.cache.Release())
	e.held.Store(e.cache.Bytes())
	return before - e.cache.Bytes(), errors.Join(errs...)
}

// Free implements Engine. With prefix reuse the sequence's committed rows
// are kept for a later sequence that starts with the same tokens.
func (e *ModelEngine) Free(id SeqID) error {
	s, ok := e.seqs[id]
	if !ok {
		return fmt.Errorf("sched: engine %s: free sequence %d: %w", e.opt.Name, id, kv.ErrUnknownSeq)
	}
	delete(e.seqs, id)
	// Live falls last: a caller waiting for it finds the cache settled.
	defer e.live.Add(-1)
	defer func() { e.held.Store(e.cache.Bytes()) }()
	if !e.reuse {
		return e.cache.Free(int(id))
	}
	// The committed rows hold the history's first n tokens (the last
	// sampled token is never evaluated); tentative rows of a failed step
	// go. A sequence freed before its first step keeps no rows, and its
	// slot serves the next start as a new one would.
	n := e.cache.Len(int(id))
	err := e.cache.Truncate(int(id), n)
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	e.open = slices.DeleteFunc(e.open, func(k keptSeq) bool { return k.id == int(id) })
	if err == nil {
		e.kept = append(e.kept, keptSeq{id: int(id), tokens: s.history[:n:n]})
	}
	return err
}

// catchUp gives sequence id, still prefilling, the rows another live
// sequence has committed of the context they share, once that one has
// evaluated all of it and it is more than id holds: clients that arrive
// together with the same instructions evaluate them once (see waits).
// A copy that fails leaves the sequence to prefill its whole context.
// It returns the tokens it took (negative after a failed copy).
func (e *ModelEngine) catchUp(id int, s *modelSeq) int {
	have := s.evaluated()
	src, n := -1, have
	e.keptMu.Lock()
	for _, o := range e.open {
		if o.id == id || len(o.tokens) <= n {
			continue // it holds no more than id does
		}
		// open holds live sequences, whose contexts this goroutine owns.
		if k := min(commonPrefix(e.seqs[SeqID(o.id)].context, s.context), len(s.context)-1); k > n && len(o.tokens) >= k {
			src, n = o.id, k
		}
	}
	e.keptMu.Unlock()
	if src < 0 {
		return 0
	}
	if err := e.copyPrefix(e.cache, id, src, n); err != nil {
		// The rows match no tokens now: evaluate them all.
		e.cache.Truncate(id, 0)
		n = 0
	}
	e.reused.Add(int64(n - have))
	s.pending = s.context[n:]
	e.opened(id, s.context[:n])
	return n - have
}

// waits reports whether member i, prefilling, should leave this step's
// prefill budget to another member that is further into the context
// they share (or as far, and earlier in the batch) and still evaluating
// it: i then copies those rows when they are done (catchUp) instead of
// evaluating them too. The leader of such a chain never waits, so the
// chain moves on.
func (e *ModelEngine) waits(i int, members []Member) bool {
	s := e.seqs[members[i].Seq]
	have := s.evaluated()
	for j, mb := range members {
		o, ok := e.seqs[mb.Seq]
		if j == i || !ok || o.decoding {
			continue
		}
		oh := o.evaluated()
		if oh < have || oh == have && j > i {
			continue
		}
		if shared := min(commonPrefix(o.context, s.context), len(s.context)-1); oh < shared {
			return true
		}
	}
	return false
}

// opened records that live sequence id's committed rows now hold tokens,
// for new sequences to copy.
func (e *ModelEngine) opened(id int, tokens []int32) {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	for i := range e.open {
		if e.open[i].id == id {
			e.open[i].tokens = tokens[:len(tokens):len(tokens)]
		}
	}
}

// Step implements Engine: one Forward over a decode slot per decoding
// member and prefill chains within PrefillChunk tokens.
func (e *ModelEngine) Step(ctx context.Context, members []Member, out []StepOut) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.batch.Reset()
	e.slot, e.eval, e.draws = e.slot[:0], e.eval[:0], e.draws[:0]
	budget := e.opt.PrefillChunk
	for i, mb := range members {
		out[i] = StepOut{}
		e.slot, e.eval = append(e.slot, -1), append(e.eval, 0)
		s, ok := e.seqs[mb.Seq]
		if !ok {
			out[i].Err = fmt.Errorf("sched: engine %s: sequence %d: %w", e.opt.Name, mb.Seq, kv.ErrUnknownSeq)
			continue
		}
		if !s.decoding && e.reuse && e.cache.CanCopy() {
			out[i].Reused = e.catchUp(int(mb.Seq), s)
			if len(s.pending) > 1 && e.waits(i, members) {
				continue
			}
		}
		n := len(s.pending)
		if n > 1 {
			// Prefill: a chunk of the context, logits only when it ends.
			n = min(n, budget)
			budget -= n
		}
		if n == 0 {
			continue // no prefill budget left this step
		}
		seq, pos := int(mb.Seq), e.cache.Len(int(mb.Seq))
		if room := e.cache.Room(seq); room < n {
			out[i].Err = fmt.Errorf("sched: engine %s: sequence %d holds %d tokens: %w", e.opt.Name, mb.Seq, pos, kv.ErrContextFull)
			continue
		}
		last := e.batch.Chain(s.pending[:n], int32(pos), seq, -1, n == len(s.pending))
		e.eval[i] = n
		if !s.decoding {
			out[i].Prefilled = n
		}
		if n == len(s.pending) {
			e.slot[i] = last
		}
	}
	if e.batch.Len() == 0 {
		return nil
	}
	if err := e.m.Forward(&e.batch, e.cache, &e.logits); err != nil {
		return fmt.Errorf("sched: engine %s: %w", e.opt.Name, err)
	}
	var errs []error
	for i, mb := range members {
		if out[i].Err != nil || e.eval[i] == 0 {
			continue
		}
		s := e.seqs[mb.Seq]
		if err := e.cache.CommitAll(int(mb.Seq)); err != nil {
			errs = append(errs, err)
			continue
		}
		s.pending = s.pending[e.eval[i]:]
		if out[i].Prefilled > 0 && e.reuse {
			e.opened(int(mb.Seq), s.context[:e.cache.Len(int(mb.Seq))])
		}
		if e.slot[i] < 0 {
			continue
		}
		s.decoding = true
		e.draws = append(e.draws, draw{seq: s, slot: e.slot[i]})
		out[i].Tokens = s.out[:]
	}
	e.sample()
	for _, d := range e.draws {
		s := d.seq
		s.history = append(s.history, d.tok)
		// pending views the history's tail: the sampled token is the
		// next context to evaluate.
		s.pending = s.history[len(s.history)-1:]
		s.out[0] = d.tok
	}
	return errors.Join(errs...)
}

// parallelSampleVocab is the vocabulary from which a step's members
// sample on the pool's threads: below it a distribution costs a few
// microseconds, less than waking the workers.
const parallelSampleVocab = 4096

// sample draws each of the step's draws. Members sample independently
// (each sequence has its own sampler and random stream, so the tokens do
// not depend on which thread draws them), and with a large vocabulary
// they sample on the pool's threads: a 32000-token distribution costs
// 40 µs greedy to 0.7 ms at a temperature, and a batch's draws were
// serial work the other threads waited out.
func (e *ModelEngine) sample() {
	draw := func(lo, hi int) {
		for k := lo; k < hi; k++ {
			d := &e.draws[k]
			d.tok = d.seq.sampler.Sample(e.logits.Row(d.slot), d.seq.history)
		}
	}
	pool := e.m.Pool()
	if len(e.draws) < 2 || e.m.Config().Vocab < parallelSampleVocab || pool.Threads() < 2 {
		draw(0, len(e.draws))
		return
	}
	pool.Run(len(e.draws), draw)
}
