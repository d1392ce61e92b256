package sched

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// SpecEngineOptions configures NewSpecEngine.
type SpecEngineOptions struct {
	Name string
	// MaxSeqs is the sequence slots, running and parked together: each
	// holds a sequence in the draft's KV cache and one in the target's
	// (default 16).
	MaxSeqs int
	// Context is the tokens per sequence (0: the target's context).
	Context int
	// DraftContext caps the draft's KV positions per sequence (0: the
	// draft's context, or Context when that is shorter). Past it the
	// draft reads a window of the latest tokens (spec.Decoder), so a
	// smaller one bounds the resident draft's KV memory at the cost of
	// its guesses; the output is the target's either way.
	DraftContext int
	// KVType is weights.F32 (default) or weights.F16, for both caches.
	KVType weights.DType
	// PrefillBudget is the most prompt tokens one step prefills, all
	// joining sequences together; one sequence is always prefilled
	// whatever its length (default 256). A spec.Decoder prefills a
	// prompt in one call, so the budget is counted in whole prompts.
	PrefillBudget int
	// PrefillChunk is the tokens per Forward of a prefill (default:
	// spec.DefaultChunkSize).
	PrefillChunk int
	// NoPrefixReuse turns off prefix reuse (see SpecEngine).
	NoPrefixReuse bool
	// PrefixCache is ModelEngineOptions.PrefixCache, for both caches'
	// memory together.
	PrefixCache int64
}

// SpecEngine is the speculative engine: each sequence is a spec.Decoder
// pairing a draft with the target, all of them sharing one draft KV cache
// and one target KV cache. A step runs one draft-and-verify round per
// decoding member: each decoder drafts its tree, then one target pass
// verifies every member's tree (spec.Group), so the target's weights are
// read once a step for the whole batch, as a ModelEngine step reads them
// once for its members' tokens. A member yields every token its round
// accepted, at least one. Tokens past a member's Limit are kept
// and handed out by the next Steps before the decoder runs again.
//
// With greedy sampling the tokens are exactly the target's; with
// temperature they follow the target's distribution (spec.Decoder is
// lossless for the tree and SD methods).
//
// Prefix reuse works as in ModelEngine, for both caches: a freed
// decoder's sequences are kept with their rows (spec.Decoder.Detach),
// and a new sequence adopts those sharing the longest prefix with its
// context, so each model prefills only the rest; a live decoder's
// committed context rows are copied, as in ModelEngine. For a streamed target,
// whose every prefill chunk reads all its weights, a chat's next turn
// then costs no prefill at all.
type SpecEngine struct {
	owner          // claimed by the scheduler that runs it
	draft, target  *model.Model
	dcache, tcache *kv.Cache
	cfg            spec.Config
	opt            SpecEngineOptions
	limit          int // context both models and caches allow
	seqs           map[SeqID]*specSeq
	next           SeqID
	live           atomic.Int64 // len(seqs), readable from any goroutine
	stats          atomic.Pointer[spec.Stats]
	done           spec.Stats // counters of freed decoders

	keptMu sync.Mutex  // guards kept and open: the scheduler asks Reusable from any goroutine
	kept   []spec.Held // freed decoders' sequences whose rows may be reused, oldest first
	// open are the live decoders' committed context rows, which a new
	// sequence may copy but not take.
	open   []openSeq
	reuse  bool         // prefix reuse is on
	reused atomic.Int64 // context tokens the target did not evaluate thanks to reuse

	group  spec.Group   // verifies the decoding members' trees in one target pass
	passes atomic.Int64 // the group's target passes
	round  []int        // the members a step runs a round for
	decs   []*spec.Decoder
	toks   [][]int32
	errs   []error
	held   atomic.Int64 // both caches' memory: sequences live, kept and spare
	// copyPrefix is kv.Cache.CopyPrefix; tests make it fail part way.
	copyPrefix func(c *kv.Cache, dst, src, n int) error
}

// openSeq is a live decoder's rows of its context, for new sequences to
// copy (Held.Tokens is a copy of the context's first tokens).
type openSeq struct {
	seq SeqID
	h   spec.Held
}

type specSeq struct {
	dec     *spec.Decoder
	have    int     // the context's first tokens the adopted target rows hold
	prompt  []int32 // the context to prefill; nil once started
	ctx     []int32 // the context
	opening bool    // started, with the target's context rows not all committed yet
	buf     []int32 // tokens emitted by the decoder, not yet handed out
	out     []int32 // the slice handed out by the last Step
}

// NewSpecEngine makes an engine on a draft/target pair with its own KV
// caches. The draft must share the target's vocabulary (check the
// tokenizers with spec.CheckVocab first: New only compares sizes). cfg is
// copied for every sequence; a stateful Trigger (a pointer, like
// *spec.CostAware) is copied too, so sequences never share its state.
// Neither model may be used by anything else while the engine runs; they
// may share one kernel pool, since draft and target never compute at
// once here. With cfg.Pipeline a decoder keeps drafting while its
// streamed target waits on IO: cfg.Lane must then be the lane the target
// was loaded with (model.Options.Lane), which the engine's decoders share
// as they share the target (LoadLanes sets this up). On a resident
// target the pipeline has nothing to overlap and is off.
func NewSpecEngine(draft, target *model.Model, cfg spec.Config, opt SpecEngineOptions) (*SpecEngine, error) {
	if opt.MaxSeqs <= 0 {
		opt.MaxSeqs = 16
	}
	if opt.PrefillBudget <= 0 {
		opt.PrefillBudget = 256
	}
	if opt.PrefillChunk <= 0 {
		opt.PrefillChunk = spec.DefaultChunkSize
	}
	if opt.KVType == 0 {
		opt.KVType = weights.F32
	}
	if opt.PrefixCache == 0 {
		opt.PrefixCache = DefaultPrefixCache
	}
	if opt.Name == "" {
		opt.Name = "spec"
	}
	if err := spec.CheckDraftContext(opt.DraftContext); err != nil {
		return nil, fmt.Errorf("sched: engine %s: draft context %w", opt.Name, err)
	}
	if cfg.Pipeline && !target.Streamed() {
		cfg.Pipeline = false // nothing to overlap, and no room for a longer tree
	}
	if dv, tv := draft.Config().Vocab, target.Config().Vocab; dv != tv {
		return nil, fmt.Errorf("sched: engine %s: the draft has %d tokens and the target %d: %w", opt.Name, dv, tv, spec.ErrVocab)
	}
	// The lane serves the target's context. A draft with a shorter one
	// drafts from a window of the latest tokens past it (spec.Decoder),
	// so its cache needs no more than its own context.
	ctx := opt.Context
	dc, tc := draft.Config().Context, target.Config().Context
	if ctx == 0 {
		ctx = tc
	} else if ctx > tc {
		// Capping it quietly would turn requests a target-only lane of
		// the same context takes into errors.
		return nil, fmt.Errorf("sched: engine %s: context %d is longer than the target's (%d)", opt.Name, ctx, tc)
	}
	newCache := func(m *model.Model, which string) (*kv.Cache, error) {
		mctx := ctx
		if m == draft {
			mctx = min(ctx, dc)
			if opt.DraftContext > 0 {
				mctx = min(mctx, opt.DraftContext)
			}
		}
		c, err := m.NewTreeCache(mctx, cfg.TreeRows(), opt.KVType)
		if err != nil {
			return nil, fmt.Errorf("sched: engine %s: %s cache: %w", opt.Name, which, err)
		}
		kc := c.Config()
		kc.MaxSeqs = opt.MaxSeqs
		if c, err = kv.New(kc); err != nil {
			return nil, fmt.Errorf("sched: engine %s: %s cache: %w", opt.Name, which, err)
		}
		return c, nil
	}
	e := &SpecEngine{draft: draft, target: target, cfg: cfg, opt: opt, seqs: map[SeqID]*specSeq{}, copyPrefix: (*kv.Cache).CopyPrefix}
	var err error
	if e.dcache, err = newCache(draft, "draft"); err != nil {
		return nil, err
	}
	if e.tcache, err = newCache(target, "target"); err != nil {
		return nil, err
	}
	// A throwaway decoder checks cfg and says which context both models
	// allow; it allocates nothing in the caches until Start.
	d, err := spec.New(draft, target, e.dcache, e.tcache, nil, e.seqConfig())
	if err != nil {
		return nil, fmt.Errorf("sched: engine %s: %w", opt.Name, err)
	}
	e.limit = d.Limit()
	e.stats.Store(&spec.Stats{Method: cfg.Method.String()})
	e.reuse = !opt.NoPrefixReuse
	return e, nil
}

// seqConfig is cfg for one more decoder: its Trigger copied when it
// keeps state behind a pointer.
func (e *SpecEngine) seqConfig() spec.Config {
	cfg := e.cfg
	if cfg.Trigger != nil {
		if v := reflect.ValueOf(cfg.Trigger); v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
			c := reflect.New(v.Elem().Type())
			c.Elem().Set(v.Elem())
			cfg.Trigger = c.Interface().(spec.Trigger)
		}
	}
	return cfg
}

// Info implements Engine.
func (e *SpecEngine) Info() EngineInfo {
	return EngineInfo{Name: e.opt.Name, MaxSeqs: e.opt.MaxSeqs, Context: e.limit, Vocab: e.target.Config().Vocab,
		SeqBytes: e.dcache.Config().SeqBytes() + e.tcache.Config().SeqBytes(), Threads: e.target.Pool().Threads(), CPUs: e.target.Pool().CPUs()}
}

// Live is the number of allocated sequences. Safe to call from any
// goroutine (metrics, tests).
func (e *SpecEngine) Live() int { return int(e.live.Load()) }

// KVBytesInUse is the KV memory of the allocated sequences, draft and
// target together. Safe to call from any goroutine.
func (e *SpecEngine) KVBytesInUse() int64 {
	return e.live.Load() * (e.dcache.Config().SeqBytes() + e.tcache.Config().SeqBytes())
}

// ReusedTokens is how many context tokens new sequences took from freed
// ones' target rows instead of prefilling them (prefix reuse). Safe to
// call from any goroutine.
func (e *SpecEngine) ReusedTokens() int64 { return e.reused.Load() }

// KVBytesHeld is the KV memory both caches hold: live sequences', and
// the buffers of freed ones kept for prefix reuse or for the next
// sequence. Safe to call from any goroutine.
func (e *SpecEngine) KVBytesHeld() int64 { return e.held.Load() }

// noteHeld publishes the caches' memory for KVBytesHeld.
func (e *SpecEngine) noteHeld() { e.held.Store(e.dcache.Bytes() + e.tcache.Bytes()) }

// Reusable is how many leading tokens of the context prompt followed by
// generated a Start would take from kept target rows. Safe to call from
// any goroutine.
func (e *SpecEngine) Reusable(prompt, generated []int32) int {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	return e.plan(prompt, generated).have
}

// plan is planStart over the kept sequences and the live decoders'
// context rows, by what their target rows hold (keptMu held).
func (e *SpecEngine) plan(prompt, generated []int32) startPlan {
	tokens := func(i int) []int32 { h := e.source(i); return h.Tokens[:h.TargetLen] }
	return planStart(len(e.kept), len(e.open), tokens, prompt, generated, e.canGrow(), e.canCopy())
}

// source is planStart's source i: kept, then live (keptMu held).
func (e *SpecEngine) source(i int) spec.Held {
	if i < len(e.kept) {
		return e.kept[i]
	}
	return e.open[i-len(e.kept)].h
}

// Stats are the speculative counters of every sequence since the engine
// was made (updated after each step). Safe to call from any goroutine.
// TargetPasses there counts the trees verified; Passes, the target
// passes that verified them.
func (e *SpecEngine) Stats() spec.Stats { return *e.stats.Load() }

// Passes is how many target passes have verified the sequences' trees:
// a step verifies all its decoding members' trees in one. Safe to call
// from any goroutine.
func (e *SpecEngine) Passes() int64 { return e.passes.Load() }

// Start implements Engine. The sequence's decoder is made now, with
// sampler as the target's sampler; its prefill runs in a later Step.
func (e *SpecEngine) Start(tokens []int32, sampler *sample.Sampler, _ string) (SeqID, error) {
	if len(tokens) == 0 {
		return 0, fmt.Errorf("sched: engine %s: start: no tokens", e.opt.Name)
	}
	if len(tokens) > e.limit {
		return 0, fmt.Errorf("sched: engine %s: %d tokens exceed the context of %d: %w", e.opt.Name, len(tokens), e.limit, ErrContextFull)
	}
	vocab := int32(e.target.Config().Vocab)
	for i, t := range tokens {
		if t < 0 || t >= vocab {
			return 0, fmt.Errorf("%w: token %d at %d is outside the vocabulary of %d", ErrInvalid, t, i, vocab)
		}
	}
	if len(e.seqs) >= e.opt.MaxSeqs {
		return 0, fmt.Errorf("sched: engine %s: all %d sequences are in use; free one or raise MaxSeqs", e.opt.Name, e.opt.MaxSeqs)
	}
	d, err := spec.New(e.draft, e.target, e.dcache, e.tcache, sampler, e.seqConfig())
	if err != nil {
		return 0, fmt.Errorf("sched: engine %s: %w", e.opt.Name, err)
	}
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	ctx := slices.Clone(tokens)
	s := &specSeq{dec: d, prompt: ctx, ctx: ctx}
	if e.reuse {
		if s.have, err = e.adopt(d, tokens); err != nil {
			return 0, fmt.Errorf("sched: engine %s: %w", e.opt.Name, err)
		}
		e.reused.Add(int64(s.have))
	}
	id := e.next
	e.next++
	e.seqs[id] = s
	e.live.Add(1)
	return id, nil
}

// adopt gives d the sequences planStart chooses for a context starting
// with tokens, as ModelEngine.newSeq does for its one cache: a kept pair
// rolled back to the prefix it shares, or new sequences given a kept
// pair's first rows (d makes new ones itself when nothing is adopted).
// have is the context tokens the adopted target rows hold. keptMu held.
func (e *SpecEngine) adopt(d *spec.Decoder, tokens []int32) (have int, err error) {
	p := e.plan(tokens, nil)
	if p.take < 0 && p.from < 0 {
		return 0, nil
	}
	var h spec.Held
	if p.take >= 0 {
		h = e.kept[p.take]
	} else if h, err = e.newPair(); err != nil {
		return 0, err
	}
	src := h
	if p.from >= 0 {
		src = e.source(p.from)
	}
	if p.take >= 0 {
		e.kept = slices.Delete(e.kept, p.take, p.take+1)
	}
	holds(&h, src, tokens, p.have) // a kept pair rolls back to it at Start
	if p.from >= 0 {
		if err := e.copyPair(h, src); err != nil {
			// Rows a failed copy left match no tokens: the pair goes,
			// kept or new.
			e.dcache.Free(h.Draft)
			e.tcache.Free(h.Target)
			return 0, err
		}
	}
	d.Adopt(h)
	return p.have, nil
}

// newPair allocates a sequence in each cache.
func (e *SpecEngine) newPair() (h spec.Held, err error) {
	if h.Draft, err = e.dcache.NewSeq(); err != nil {
		return h, err
	}
	if h.Target, err = e.tcache.NewSeq(); err != nil {
		e.dcache.Free(h.Draft)
		return h, err
	}
	return h, nil
}

// holds records in h the rows of src that hold the first tokens of a
// context: the draft's it shares, and the target's first have. The
// tokens are recorded too: a decoder freed before it starts hands h
// back (Detach), and it is kept with them.
func holds(h *spec.Held, src spec.Held, ctx []int32, have int) {
	h.DraftLen = min(commonPrefix(src.Tokens[:src.DraftLen], ctx), len(ctx)-1)
	h.TargetLen = have
	h.Tokens = slices.Clone(ctx[:max(h.DraftLen, h.TargetLen)])
}

// copyPair copies into pair h the rows of src that holds recorded. A
// failed copy leaves rows that match no tokens; the caller frees or
// empties h.
func (e *SpecEngine) copyPair(h, src spec.Held) error {
	return errors.Join(e.copyPrefix(e.dcache, h.Draft, src.Draft, h.DraftLen), e.copyPrefix(e.tcache, h.Target, src.Target, h.TargetLen))
}

// canGrow reports whether a new sequence pair may take memory beside the
// kept ones (keptMu held).
func (e *SpecEngine) canGrow() bool {
	return roomToKeep(int(e.live.Load())+len(e.kept), e.opt.MaxSeqs,
		e.dcache.Config().SeqBytes()+e.tcache.Config().SeqBytes(), e.opt.PrefixCache)
}

// canCopy reports whether both caches can copy rows between sequences.
func (e *SpecEngine) canCopy() bool { return e.dcache.CanCopy() && e.tcache.CanCopy() }

// StreamStats is the target's weight streaming counters (ok false when
// its weights are resident; the draft is always resident). Safe from
// any goroutine.
func (e *SpecEngine) StreamStats() (weights.StreamStats, bool) { return e.target.StreamStats() }

// TrimKV is ModelEngine.TrimKV for both caches.
func (e *SpecEngine) TrimKV() (int64, error) {
	before := e.dcache.Bytes() + e.tcache.Bytes()
	e.keptMu.Lock()
	var errs []error
	for _, h := range e.kept {
		errs = append(errs, e.dcache.Free(h.Draft), e.tcache.Free(h.Target))
	}
	e.kept = nil
	e.keptMu.Unlock()
	errs = append(errs, e.dcache.Release(), e.tcache.Release())
	e.noteHeld()
	return before - e.dcache.Bytes() - e.tcache.Bytes(), errors.Join(errs...)
}

// Free implements Engine: the decoder's sequences in both caches are
// released (kept for reuse, with prefix reuse), and tokens it emitted
// but did not hand out are dropped (a rebuilt sequence generates them
// again).
func (e *SpecEngine) Free(id SeqID) error {
	s, ok := e.seqs[id]
	if !ok {
		return fmt.Errorf("sched: engine %s: free sequence %d: %w", e.opt.Name, id, kv.ErrUnknownSeq)
	}
	e.closed(id)
	if !e.reuse {
		s.dec.Close()
	} else if h, ok := s.dec.Detach(); ok {
		// Kept even without rows: its slots serve the next start.
		e.keptMu.Lock()
		e.kept = append(e.kept, h)
		e.keptMu.Unlock()
	}
	e.done = addSpecStats(e.done, s.stats())
	delete(e.seqs, id)
	e.noteHeld()
	e.live.Add(-1) // last: a caller waiting for Live to fall finds the caches settled
	return nil
}

// Step implements Engine: members with buffered tokens take them; the
// others prefill (within PrefillBudget) or run one speculative round.
func (e *SpecEngine) Step(ctx context.Context, members []Member, out []StepOut) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer e.publishStats()
	defer e.noteHeld() // decoders allocate when they start, and free when they fail
	budget := e.opt.PrefillBudget
	prefilled := false
	e.round = e.round[:0]
	for i, mb := range members {
		out[i] = StepOut{}
		s, ok := e.seqs[mb.Seq]
		if !ok {
			out[i].Err = fmt.Errorf("sched: engine %s: sequence %d: %w", e.opt.Name, mb.Seq, kv.ErrUnknownSeq)
			continue
		}
		switch {
		case len(s.buf) > 0:
		case s.prompt != nil:
			if e.reuse && e.canCopy() {
				out[i].Reused = e.catchUp(mb.Seq, s)
				if e.waits(i, members) {
					continue
				}
			}
			rest := len(s.prompt) - s.have // what the adopted rows do not hold
			if prefilled && rest > budget {
				continue // no prefill budget left this step
			}
			if err := s.dec.Start(ctx, s.prompt, e.opt.PrefillChunk); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				out[i].Err = fmt.Errorf("sched: engine %s: sequence %d: prefill: %w", e.opt.Name, mb.Seq, err)
				continue
			}
			prefilled = true
			budget -= rest
			out[i].Prefilled = rest
			s.prompt = nil
			s.opening = e.reuse
			e.opened(mb.Seq, s)
			continue
		default:
			e.round = append(e.round, i) // below, with the others decoding
			continue
		}
		s.handOut(mb.Limit, &out[i])
	}
	if len(e.round) == 0 {
		return nil
	}
	// One round of every decoding member, their trees verified in one
	// target pass.
	e.decs = e.decs[:0]
	for _, i := range e.round {
		e.decs = append(e.decs, e.seqs[members[i].Seq].dec)
	}
	e.toks, e.errs = slices.Grow(e.toks[:0], len(e.round))[:len(e.round)], slices.Grow(e.errs[:0], len(e.round))[:len(e.round)]
	e.group.Step(ctx, e.decs, e.toks, e.errs)
	e.passes.Store(int64(e.group.Passes()))
	for k, i := range e.round {
		mb := members[i]
		s := e.seqs[mb.Seq]
		if err := e.errs[k]; err != nil {
			e.closed(mb.Seq) // a failed round freed the decoder's sequences
			if ctx.Err() != nil {
				return ctx.Err()
			}
			out[i].Err = fmt.Errorf("sched: engine %s: sequence %d: %w", e.opt.Name, mb.Seq, err)
			continue
		}
		s.buf = append(s.buf, e.toks[k]...)
		e.opened(mb.Seq, s) // the first round commits the prompt's last target rows
		s.handOut(mb.Limit, &out[i])
	}
	return nil
}

// stats are the decoder's counters with Emitted the tokens handed out:
// those a round accepted past the request's end, which Free drops,
// counted 62 tokens for 50 delivered over five 10-token requests and
// overstated tokens per pass by a quarter.
func (s *specSeq) stats() spec.Stats {
	st := s.dec.Stats()
	st.Emitted -= len(s.buf)
	return st
}

// handOut moves up to limit (at least one) buffered tokens to o.
func (s *specSeq) handOut(limit int, o *StepOut) {
	n := min(max(limit, 1), len(s.buf))
	s.out = append(s.out[:0], s.buf[:n]...)
	s.buf = s.buf[:copy(s.buf, s.buf[n:])]
	o.Tokens = s.out
}

// catchUp gives sequence id, about to prefill, the rows a live decoder
// has committed of the context they share since id started, when they
// hold more of it than the pair it adopted: as ModelEngine.catchUp, for
// both caches. A copy that fails leaves the pair holding nothing, to
// prefill whole. It returns the target tokens it took (negative after a
// failed copy).
func (e *SpecEngine) catchUp(id SeqID, s *specSeq) int {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	src, have := -1, s.have
	for i, o := range e.open {
		if n := min(commonPrefix(o.h.Tokens[:o.h.TargetLen], s.prompt), len(s.prompt)-1); o.seq != id && n > have {
			src, have = i, n
		}
	}
	if src < 0 {
		return 0
	}
	h, ok := s.dec.Adopted()
	if !ok {
		var err error
		if h, err = e.newPair(); err != nil {
			return 0 // it prefills whole, allocating at Start
		}
	}
	holds(&h, e.open[src].h, s.prompt, have)
	if err := e.copyPair(h, e.open[src].h); err != nil {
		e.dcache.Truncate(h.Draft, 0)
		e.tcache.Truncate(h.Target, 0)
		h.DraftLen, h.TargetLen, h.Tokens, have = 0, 0, nil, 0
	}
	s.dec.Adopt(h)
	took := have - s.have
	s.have = have
	e.reused.Add(int64(took))
	return took
}

// waits reports whether member i, about to prefill, should leave its
// prefill to a later step because another member has started on more of
// the context they share than i holds and has not committed it yet (a
// decoder's target commits its prompt's last rows with its first
// round): i then copies them (catchUp) instead of evaluating them too.
// Such a leader decodes already, so it never waits itself.
func (e *SpecEngine) waits(i int, members []Member) bool {
	s := e.seqs[members[i].Seq]
	for j, mb := range members {
		o, ok := e.seqs[mb.Seq]
		if j == i || !ok || o.prompt != nil || !o.opening {
			continue
		}
		h, ok := o.dec.Rows()
		if shared := min(commonPrefix(o.ctx, s.prompt), len(s.prompt)-1); ok && shared > s.have && h.TargetLen < shared {
			return true
		}
	}
	return false
}

// opened records what live sequence id's decoder holds of its context,
// for new sequences to copy, until all of it is committed in the target.
func (e *SpecEngine) opened(id SeqID, s *specSeq) {
	if !s.opening {
		return
	}
	h, ok := s.dec.Rows()
	if !ok {
		return
	}
	h.DraftLen, h.TargetLen = min(h.DraftLen, len(s.ctx)), min(h.TargetLen, len(s.ctx))
	h.Tokens = slices.Clone(h.Tokens[:max(h.DraftLen, h.TargetLen)])
	s.opening = h.TargetLen < len(s.ctx)-1
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	for i := range e.open {
		if e.open[i].seq == id {
			e.open[i].h = h
			return
		}
	}
	e.open = append(e.open, openSeq{seq: id, h: h})
}

// closed drops live sequence id's rows from the copy sources.
func (e *SpecEngine) closed(id SeqID) {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	e.open = slices.DeleteFunc(e.open, func(o openSeq) bool { return o.seq == id })
}

// publishStats stores the counters of the freed decoders and the live
// ones for Stats.
func (e *SpecEngine) publishStats() {
	st := e.done
	st.AcceptLen = slices.Clone(st.AcceptLen)
	for _, s := range e.seqs {
		st = addSpecStats(st, s.stats())
	}
	st.Method = e.cfg.Method.String()
	e.stats.Store(&st)
}

// addSpecStats sums two decoders' counters.
func addSpecStats(a, b spec.Stats) spec.Stats {
	a.Emitted += b.Emitted
	a.TargetPasses += b.TargetPasses
	a.DraftSteps += b.DraftSteps
	a.DraftTokens += b.DraftTokens
	a.Verified += b.Verified
	a.Accepted += b.Accepted
	a.MaxTree = max(a.MaxTree, b.MaxTree)
	a.Filled += b.Filled
	a.FilledAccepted += b.FilledAccepted
	a.PipelineSteps += b.PipelineSteps
	a.KeptNodes += b.KeptNodes
	a.Undrafted += b.Undrafted
	a.Slides += b.Slides
	for len(a.AcceptLen) < len(b.AcceptLen) {
		a.AcceptLen = append(a.AcceptLen, 0)
	}
	for n, c := range b.AcceptLen {
		a.AcceptLen[n] += c
	}
	a.DraftTime += b.DraftTime
	a.TargetTime += b.TargetTime
	a.IOWait += b.IOWait
	return a
}
