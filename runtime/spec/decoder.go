package spec

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// Method selects how the draft guesses and how its guesses are checked.
type Method int

const (
	// Tree grows a token tree paced by confidence, verifies it when the
	// trigger says (adaptively, by default) and, with Pipeline, keeps
	// drafting while the target waits on IO. Lossless.
	Tree Method = iota
	// SD is classic speculative decoding: a chain of DraftLen draft
	// tokens, verified, repeated. Lossless.
	SD
	// BiLD is the Big-Little decoder: the draft runs until its top
	// probability drops below Fallback, the target checks the chain and
	// rolls back at the first token it finds too unlikely (cross-entropy
	// above Rollback). Lossy by design: its agreement with the target is
	// measured, not guaranteed.
	BiLD
)

func (m Method) String() string {
	switch m {
	case Tree:
		return "tree"
	case SD:
		return "sd"
	case BiLD:
		return "bild"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// The tree's defaults, chosen with tandem bench spec (README, "Speculative
// decoding"): a lower threshold and more branches than LLMCad's 0.3 gave
// more tokens per target pass, and two frontiers per draft step cost less
// than two steps. MaxTree is a cap, not a size: a streamed target verifies
// 64 tokens in the time of one (its pass is all IO), so the cap is set
// where a fixed tree still gained, and the cost trigger sizes the tree
// below it (small for a resident target).
const (
	DefaultBranchThreshold = 0.1
	DefaultMaxBranches     = 16
	DefaultMaxTree         = 128
	DefaultDraftBatch      = 2
	DefaultDraftLen        = 4 // SD's
)

// Config tunes a Decoder. The zero value is the tree method with its
// defaults.
type Config struct {
	Method Method

	// BranchThreshold opens a branch for every candidate whose draft
	// probability exceeds it (the most likely candidate always continues
	// the branch). Default DefaultBranchThreshold.
	BranchThreshold float64
	// MaxBranches caps the branches open at once (default
	// DefaultMaxBranches; SD and BiLD draft one).
	MaxBranches int
	// MaxTree caps the drafted tokens per verification; it is also M, the
	// draft budget the pacer shares out (default DefaultMaxTree).
	MaxTree int
	// Floor prunes branches whose cumulative confidence falls below it
	// (default 1e-4).
	Floor float64
	// DraftBatch is how many branches one draft step extends in one
	// Forward (default DefaultDraftBatch).
	DraftBatch int
	// Pacer picks the branches to extend (nil: FairPacer for the tree,
	// ChainPacer for SD and BiLD).
	Pacer Pacer
	// Trigger decides when to verify (nil: CostAware for the tree,
	// FixedSize{DraftLen} for SD and BiLD's MaxTree cap). A Trigger keeps
	// state: one per Decoder.
	Trigger Trigger
	// Pipeline keeps the draft growing the tree while the target waits
	// for streamed weights. It needs a streamed target loaded with
	// model.Options{Lane: Lane}; it is ignored for a resident target,
	// which never waits.
	Pipeline bool
	Lane     *Lane
	// PipelineCap caps the drafted tokens the tree may hold while a
	// verification runs (default 2×MaxTree).
	PipelineCap int

	// DraftLen is SD's draft length (default DefaultDraftLen).
	DraftLen int
	// Fallback and Rollback are BiLD's thresholds (defaults 0.5 and 2).
	Fallback, Rollback float64
}

func (c Config) withDefaults() Config {
	if c.BranchThreshold == 0 {
		c.BranchThreshold = DefaultBranchThreshold
	}
	if c.MaxBranches == 0 {
		c.MaxBranches = DefaultMaxBranches
	}
	if c.MaxTree == 0 {
		c.MaxTree = DefaultMaxTree
	}
	if c.Floor == 0 {
		c.Floor = 1e-4
	}
	if c.DraftBatch == 0 {
		c.DraftBatch = DefaultDraftBatch
	}
	if c.DraftLen == 0 {
		c.DraftLen = DefaultDraftLen
	}
	if c.Fallback == 0 {
		c.Fallback = 0.5
	}
	if c.Rollback == 0 {
		c.Rollback = 2
	}
	switch c.Method {
	case SD:
		c.MaxBranches, c.MaxTree = 1, c.DraftLen
		c.BranchThreshold = math.Inf(1)
		if c.Pacer == nil {
			c.Pacer = ChainPacer{}
		}
		if c.Trigger == nil {
			c.Trigger = FixedSize{N: c.DraftLen}
		}
	case BiLD:
		c.MaxBranches = 1
		c.BranchThreshold = math.Inf(1)
		if c.Pacer == nil {
			c.Pacer = ChainPacer{}
		}
		if c.Trigger == nil {
			c.Trigger = FixedSize{N: c.MaxTree}
		}
	default:
		if c.Pacer == nil {
			c.Pacer = FairPacer{}
		}
		if c.Trigger == nil {
			c.Trigger = &CostAware{}
		}
	}
	if c.PipelineCap == 0 {
		c.PipelineCap = 2 * c.MaxTree
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Method < Tree || c.Method > BiLD:
		return fmt.Errorf("spec: unknown method %d", c.Method)
	// Written so that NaN fails too (a branch threshold is +Inf for SD
	// and BiLD, which open no branches).
	case !(c.BranchThreshold >= 0), !(c.Floor >= 0), !(c.Fallback >= 0), !(c.Rollback >= 0):
		return fmt.Errorf("spec: thresholds must be numbers, not negative (branch %g, floor %g, fallback %g, rollback %g)", c.BranchThreshold, c.Floor, c.Fallback, c.Rollback)
	case c.MaxBranches < 0, c.MaxTree < 0, c.DraftBatch < 0, c.DraftLen < 0, c.PipelineCap < 0:
		return fmt.Errorf("spec: sizes must not be negative (branches %d, tree %d, draft batch %d, draft length %d, pipeline cap %d)",
			c.MaxBranches, c.MaxTree, c.DraftBatch, c.DraftLen, c.PipelineCap)
	}
	return nil
}

// Stats are a Decoder's counters since New, over every generation.
type Stats struct {
	Method       string
	Emitted      int // tokens emitted
	TargetPasses int // verifications: target passes over the decoder's tree (a Group's pass counts for each tree in it)
	DraftSteps   int // draft Forward calls
	DraftTokens  int // draft batch slots evaluated
	Verified     int // drafted tokens the target checked
	Accepted     int // drafted tokens accepted
	MaxTree      int // largest tree verified (drafted tokens)
	// Filled are the verified tokens that came from free rows (Filler):
	// proposed by the draft, never extended by it. FilledAccepted of them
	// were accepted.
	Filled, FilledAccepted int
	// PipelineSteps are the draft steps run while a verification was in
	// flight; KeptNodes the drafted tokens carried into the next round
	// because they hung under the token the target chose.
	PipelineSteps, KeptNodes int
	// Undrafted counts the verifications of the root alone, with no
	// drafted token: the trigger paused drafting (CostAware, while
	// drafting did not pay), or the context left no room to draft.
	Undrafted int
	// Slides counts the times the draft's window moved on: a draft
	// whose context is shorter than the generation reads only the
	// latest tokens (Decoder.Limit).
	Slides int
	// AcceptLen[n] counts the verifications that accepted n drafted
	// tokens: the acceptance-vs-depth curve.
	AcceptLen  []int
	DraftTime  time.Duration // in draft Forward calls
	TargetTime time.Duration // in target Forward calls (its IO waits included)
	IOWait     time.Duration // of TargetTime, waiting for streamed weights
}

// TokensPerPass is the tokens emitted per target pass.
func (s Stats) TokensPerPass() float64 {
	if s.TargetPasses == 0 {
		return 0
	}
	return float64(s.Emitted) / float64(s.TargetPasses)
}

// AcceptanceRate is the share of the drafted tokens the target checked
// that it accepted. A tree checks alternatives that cannot all be right,
// so its rate is lower than a chain's for the same draft.
func (s Stats) AcceptanceRate() float64 {
	if s.Verified == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Verified)
}

// Decoder generates with a draft/target pair. With the lossless methods
// it emits exactly the tokens the target alone would: greedy, or sampled
// with the same seed (the target draws every token itself, one word of
// its stream a token; see choose).
//
// Each model has its own KV cache; the decoder holds one sequence in
// each from Start to Close. A Decoder is not safe for concurrent use.
type Decoder struct {
	cfg            Config
	draft, target  *model.Model
	dcache, tcache *kv.Cache
	dseq, tseq     int
	started        bool
	adopted        *Held // sequences the next Start continues (Adopt)
	limit          int   // positions the target and its cache allow: the generation's context
	dlimit         int   // positions the draft and its cache allow
	shift          int   // the target position of the draft's first row: past its context, the draft reads a window (slide)
	notes          []string

	sampler  *sample.Sampler // the target's: picks and accepts tokens
	proposer *sample.Sampler // the draft's sampling distribution (sampling only; it draws nothing)
	race     []int32         // propose's buffer of the draft's race finishers
	agree    agreement       // how often the target's draw follows the draft's first finisher (sampling)

	filler   Filler // the trigger, when the tree fills free verification rows
	tree     *tree
	pending  []int32 // accepted tokens before the root the draft has no KV row for
	prefix   []int32 // prompt tokens before the root the target has no KV row for
	history  []int32 // prompt and emitted tokens, the root last
	handover bool    // BiLD: the draft declined to guess past a leaf
	// This round's draft work outside verification, and the last step's.
	roundDraft time.Duration
	last       stepInfo

	db, tb     model.Batch
	dout, tout model.Logits
	probs      []float32 // scratch distribution
	stats      Stats
	ioBase     time.Duration
	pass       time.Duration // the last target pass, its IO wait, and its reads' time
	passIO     time.Duration
	passRead   time.Duration
}

// TreeRows is how many rows past their context the caches should have
// (model.NewTreeCache) so that the tree is never cut short by the rows
// left: a tree of 128 tokens takes 128 tentative rows but only as many
// positions as it is deep. Caches with fewer rows still work, with
// smaller trees near the end of their context.
func (c Config) TreeRows() int {
	c = c.withDefaults()
	if c.Pipeline {
		return max(c.MaxTree, c.PipelineCap) + 1
	}
	return c.MaxTree + 1
}

// New checks a pair and prepares a decoder; Start begins a generation.
// sampler picks the target's tokens (nil: greedy). The caches must be
// the draft's and the target's (Model.NewTreeCache with cfg.TreeRows, or
// Model.NewCache).
func New(draft, target *model.Model, dcache, tcache *kv.Cache, sampler *sample.Sampler, cfg Config) (*Decoder, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	dv, tv := draft.Config().Vocab, target.Config().Vocab
	if dv != tv {
		return nil, fmt.Errorf("spec: the draft's vocabulary has %d tokens and the target's %d: a draft must share the target's tokenizer (%w)", dv, tv, ErrVocab)
	}
	if sampler == nil {
		sampler = sample.New(sample.Options{})
	}
	d := &Decoder{cfg: cfg, draft: draft, target: target, dcache: dcache, tcache: tcache, sampler: sampler}
	if ss, ok := target.StreamStats(); ok {
		d.ioBase = ss.Stall
	}
	d.proposer = sample.New(sampler.Options())
	tc := min(target.Config().Context, tcache.Config().Context)
	dc := min(draft.Config().Context, dcache.Config().Context)
	if dc < MinDraftContext {
		return nil, fmt.Errorf("spec: the draft's context is %d positions; it needs at least %d", dc, MinDraftContext)
	}
	d.limit, d.dlimit = tc, dc
	if dc < tc {
		d.notes = append(d.notes, fmt.Sprintf("the draft's context (%d) is shorter than the target's (%d): past it, the draft reads its last %d tokens", dc, tc, d.window()))
	}
	if f, ok := cfg.Trigger.(Filler); ok && cfg.Method == Tree {
		d.filler = f
	}
	if cfg.Pipeline && !target.Streamed() {
		d.cfg.Pipeline = false
		d.notes = append(d.notes, "pipeline off: the target is resident, so it never waits on IO for the draft to fill")
	}
	if d.cfg.Pipeline && cfg.Lane == nil {
		return nil, errors.New("spec: the pipeline needs Config.Lane, with the target loaded with model.Options{Lane: lane}")
	}
	return d, nil
}

// ErrVocab is returned (wrapped) when draft and target do not share a
// vocabulary.
var ErrVocab = errors.New("draft and target vocabularies differ")

// Notes are things the decoder adjusted and the user should know.
func (d *Decoder) Notes() []string { return d.notes }

// MinDraftContext is the fewest positions a draft's cache may have: a
// window of one token and the root.
const MinDraftContext = 2

// CheckDraftContext checks a cap on the draft's positions as the
// settings that take one (--draft-ctx, SpecEngineOptions.DraftContext)
// read it: 0 for the draft's own context, else at least MinDraftContext.
// The error names the value; the caller names the setting before it.
func CheckDraftContext(n int) error {
	if n < 0 || n > 0 && n < MinDraftContext {
		return fmt.Errorf("%d: want 0 (the draft's own context) or at least %d", n, MinDraftContext)
	}
	return nil
}

// Limit is the context a generation can use: the target's. A draft with
// a shorter context drafts from a window of the latest tokens once the
// generation outgrows it (slide); the output is the target's either way.
func (d *Decoder) Limit() int { return d.limit }

// Stats returns the counters.
func (d *Decoder) Stats() Stats {
	st := d.stats
	st.AcceptLen = slices.Clone(d.stats.AcceptLen)
	st.Method = d.cfg.Method.String()
	if ss, ok := d.target.StreamStats(); ok {
		st.IOWait = ss.Stall - d.ioBase
	}
	return st
}

// Held are a decoder's sequences handed over by Detach, for another
// decoder to Adopt: a sequence in the draft's cache and one in the
// target's, whose first DraftLen and TargetLen committed rows hold the
// first tokens of Tokens.
type Held struct {
	Draft, Target       int // sequence ids in the draft's and the target's cache
	DraftLen, TargetLen int
	Tokens              []int32 // the prompt and the emitted tokens
}

// Detach ends the generation as Close does, but hands its sequences
// over with their committed rows instead of freeing them (prefix reuse:
// a later prompt that starts with the same tokens need not prefill
// them). The rows of the prompt and of the emitted tokens the draft or
// the target evaluated are committed; tentative rows are dropped. ok is
// false when the decoder holds no sequences (it never started, or an
// error freed them); sequences adopted but not yet started are handed
// back.
func (d *Decoder) Detach() (h Held, ok bool) {
	if !d.started {
		if d.adopted == nil {
			return Held{}, false
		}
		h, d.adopted = *d.adopted, nil
		return h, true
	}
	dn, tn := d.dcache.Len(d.dseq), d.tcache.Len(d.tseq)
	// Truncating to the committed rows only drops the tentative ones.
	d.dcache.Truncate(d.dseq, dn)
	d.tcache.Truncate(d.tseq, tn)
	d.started = false
	return Held{Draft: d.dseq, Target: d.tseq, DraftLen: d.heldDraftRows(), TargetLen: tn, Tokens: slices.Clone(d.history)}, true
}

// Rows says what the decoder's sequences hold now, as Detach would hand
// them over, without ending the generation: another decoder may copy
// their committed rows (kv.Cache.CopyPrefix) but must not Adopt them. ok
// is false before Start. Tokens is the decoder's own history: copy what
// you keep past its next Step.
func (d *Decoder) Rows() (h Held, ok bool) {
	if !d.started {
		return Held{}, false
	}
	return Held{Draft: d.dseq, Target: d.tseq, DraftLen: d.heldDraftRows(), TargetLen: d.tcache.Len(d.tseq), Tokens: d.history}, true
}

// heldDraftRows is how many of the draft's committed rows hold the first
// tokens of the history: none once its window has slid, since its rows
// then begin past the first token.
func (d *Decoder) heldDraftRows() int {
	if d.shift > 0 {
		return 0
	}
	return d.dcache.Len(d.dseq)
}

// Adopted is the pair the next Start continues (Adopt), if any.
func (d *Decoder) Adopted() (Held, bool) {
	if d.adopted == nil {
		return Held{}, false
	}
	return *d.adopted, true
}

// Adopt makes the next Start continue h's sequences, which must belong
// to this decoder's caches, instead of allocating new ones: their first
// h.DraftLen and h.TargetLen committed rows must hold the first tokens
// of that Start's prompt (the caller compares them, Detach's Tokens
// against the prompt). Start rolls each back to those rows and
// prefills only the rest. Close frees adopted sequences.
func (d *Decoder) Adopt(h Held) { d.adopted = &h }

// dropAdopted frees sequences adopted but not started.
func (d *Decoder) dropAdopted() {
	if h := d.adopted; h != nil {
		d.dcache.Free(h.Draft)
		d.tcache.Free(h.Target)
		d.adopted = nil
	}
}

// Start prefills prompt (BOS first) into a new sequence of each model
// (or into adopted ones, past the rows they hold): all but its last
// token, which becomes the root of the first tree. The target prefills
// all but the body's last chunk, which rides with the first verification
// instead: a streamed target then reads its weights once for the prompt
// and the first tree, not once for each.
func (d *Decoder) Start(ctx context.Context, prompt []int32, chunk int) error {
	if d.started {
		return errors.New("spec: decoder already started; Close it first")
	}
	if len(prompt) == 0 {
		d.dropAdopted()
		return errors.New("spec: empty prompt; a llama prompt starts with BOS")
	}
	if len(prompt) > d.limit {
		d.dropAdopted()
		return fmt.Errorf("spec: prompt of %d tokens does not fit the context of %d: %w", len(prompt), d.limit, kv.ErrContextFull)
	}
	if chunk <= 0 {
		chunk = DefaultChunkSize
	}
	body := prompt[:len(prompt)-1]
	// A prompt that leaves the draft too little room starts it on a
	// window of its latest tokens.
	d.shift = 0
	if d.draftRoomAt(len(body)) < d.slideRoom() {
		d.shift = len(body) - min(d.window(), len(body))
	}
	dhave, thave := 0, 0 // rows already holding the body's first tokens
	if h := d.adopted; h != nil {
		d.adopted = nil
		d.dseq, d.tseq = h.Draft, h.Target
		dhave, thave = min(h.DraftLen, len(body)), min(h.TargetLen, len(body))
		if d.shift > 0 {
			dhave = 0
		}
		if err := errors.Join(d.dcache.Truncate(d.dseq, dhave), d.tcache.Truncate(d.tseq, thave)); err != nil {
			d.dcache.Free(d.dseq)
			d.tcache.Free(d.tseq)
			return fmt.Errorf("spec: adopted sequences: %w", err)
		}
	} else {
		var err error
		if d.dseq, err = d.dcache.NewSeq(); err != nil {
			return fmt.Errorf("spec: draft: %w", err)
		}
		if d.tseq, err = d.tcache.NewSeq(); err != nil {
			d.dcache.Free(d.dseq)
			return fmt.Errorf("spec: target: %w", err)
		}
	}
	d.started = true
	prefilled := max(thave, len(body)-min(len(body), chunk)) // by the target now; the rest rides
	for _, mc := range []struct {
		m        *model.Model
		c        *kv.Cache
		seq      int
		toks     []int32 // from the model's first position
		from, to int
	}{{d.draft, d.dcache, d.dseq, body[d.shift:], dhave, len(body) - d.shift}, {d.target, d.tcache, d.tseq, body, thave, prefilled}} {
		for off := mc.from; off < mc.to; off += chunk {
			if err := ctx.Err(); err != nil {
				d.Close()
				return err
			}
			end := min(off+chunk, mc.to)
			d.db.Reset()
			d.db.Chain(mc.toks[off:end], int32(off), mc.seq, -1, false)
			if err := mc.m.Forward(&d.db, mc.c, &d.dout); err != nil {
				d.Close()
				return fmt.Errorf("spec: prefill: %w", err)
			}
			mc.c.CommitAll(mc.seq)
		}
	}
	d.tree = newTree(prompt[len(prompt)-1])
	d.pending = nil
	d.prefix = append(d.prefix[:0], body[prefilled:]...)
	d.history = append(d.history[:0], prompt...)
	return nil
}

// Close frees the decoder's sequences, adopted ones included. The
// decoder can Start again.
func (d *Decoder) Close() {
	d.dropAdopted()
	if !d.started {
		return
	}
	d.dcache.Free(d.dseq)
	d.tcache.Free(d.tseq)
	d.started = false
}

// rootPos is the root's position: the tokens before it.
func (d *Decoder) rootPos() int { return d.tcache.Len(d.tseq) + len(d.prefix) }

// maxDepth is how far below the root the tree may reach.
func (d *Decoder) maxDepth() int { return min(d.targetRoom(), d.draftRoomAt(d.rootPos())) }

// targetRoom is how many positions the target has below the root.
func (d *Decoder) targetRoom() int { return d.limit - 1 - d.rootPos() }

// draftRoomAt is how many positions the draft has below a root at
// (target) position root.
func (d *Decoder) draftRoomAt(root int) int { return d.dlimit - 1 - (root - d.shift) }

// window is how many of the latest tokens the draft reads after a
// slide: half its context, so it slides once per half a context.
func (d *Decoder) window() int { return d.dlimit / 2 }

// slideRoom is the draft's room below the root under which its window
// slides: the tree is cut short near the end of the context, and a
// draft that can reach no deeper than this guesses little.
func (d *Decoder) slideRoom() int { return max(1, min(32, d.dlimit/4)) }

// slide moves the draft's window on when the draft has too little room
// left below the root: its rows go, and the latest tokens before the root
// become pending, read by the next draft step at the window's start.
// Output does not change: the draft only guesses, and the target checks.
// Called between rounds, with no tree in flight.
func (d *Decoder) slide() error {
	root := d.rootPos()
	if d.draftRoomAt(root) >= d.slideRoom() {
		return nil
	}
	if root >= len(d.history) {
		return fmt.Errorf("spec: the root is at %d, past the %d tokens of the history", root, len(d.history))
	}
	keep := min(d.window(), root)
	if err := d.dcache.Truncate(d.dseq, 0); err != nil {
		return fmt.Errorf("spec: draft: %w", err)
	}
	d.shift = root - keep
	d.pending = append(d.pending[:0], d.history[root-keep:root]...)
	d.tree = newTree(d.history[root])
	d.stats.Slides++
	return nil
}

// maxNodes is how many drafted tokens a tree may hold now: the method's
// cap, bounded by the rows both caches have left. The target's room is
// counted from its committed rows and the prompt tokens that ride with
// the tree, not from its tentative rows: while a pipelined verification
// runs, its tree's rows are in flight in another goroutine, and the tree
// they came from is counted here anyway.
func (d *Decoder) maxNodes(cap int) int {
	troom := d.tcache.Config().SeqRows() - d.rootPos()
	return max(0, min(cap, troom-1, d.dcache.Room(d.dseq)-1-len(d.pending)))
}

// Step drafts and verifies once and returns the tokens it emits (at
// least one), the last of them the target's own choice. It returns an
// error wrapping kv.ErrContextFull when no position is left. On any
// other error both caches are left holding exactly the tokens emitted
// before the call; the generation cannot go on (Close it).
func (d *Decoder) Step(ctx context.Context) ([]int32, error) {
	if err := d.canStep(); err != nil {
		return nil, err
	}
	out, err := d.step(ctx)
	if err != nil {
		return nil, d.fail(err)
	}
	return out, nil
}

// canStep says why Step cannot run now, if it cannot.
func (d *Decoder) canStep() error {
	if !d.started {
		return errors.New("spec: step before Start")
	}
	if d.targetRoom() < 0 || d.tcache.Room(d.tseq) < 1+len(d.prefix) {
		return fmt.Errorf("spec: position %d: %w", d.rootPos(), kv.ErrContextFull)
	}
	return nil
}

// fail ends the generation after a step failed part way: both caches go
// back to the tokens emitted before it, and the sequences are freed.
func (d *Decoder) fail(err error) error {
	d.dcache.Drop(d.dseq)
	d.tcache.Drop(d.tseq)
	d.tree, d.pending, d.prefix = nil, nil, nil
	d.started = false
	d.dcache.Free(d.dseq)
	d.tcache.Free(d.tseq)
	return err
}

func (d *Decoder) step(ctx context.Context) ([]int32, error) {
	snap, err := d.grow(ctx)
	if err != nil {
		return nil, err
	}
	if d.cfg.Pipeline {
		err = d.verifyPipelined(ctx)
	} else {
		err = d.verify()
	}
	if err != nil {
		return nil, err
	}
	return d.accept(snap, d.tout.Row, 0)
}

// grow drafts until the trigger says verify, and puts the tree in the
// target's batch.
func (d *Decoder) grow(ctx context.Context) (snapshot, error) {
	if err := d.startRound(); err != nil {
		return snapshot{}, err
	}
	for !d.shouldVerify(d.cfg.MaxTree) {
		if err := ctx.Err(); err != nil {
			return snapshot{}, err
		}
		stepped, err := d.draftStep(d.cfg.MaxTree)
		if err != nil {
			return snapshot{}, err
		}
		if !stepped {
			break // the pacer picked nothing
		}
		d.roundDraft += d.last.time
	}
	return d.snapshot(d.fill()), nil
}

// startRound clears the last round's draft accounting and slides the
// draft's window if it needs room: the start of grow, alone or in a
// Group.
func (d *Decoder) startRound() error {
	d.handover = false
	d.roundDraft, d.last = 0, stepInfo{}
	return d.slide()
}

// shouldVerify asks the trigger, after the hard limits: the tree is
// full, or nothing is left to extend.
func (d *Decoder) shouldVerify(cap int) bool {
	t := d.tree
	nodes := t.size()
	open := d.openLeaves(nil)
	if nodes >= d.maxNodes(cap) || len(open) == 0 {
		return true
	}
	byDepth := t.confByDepth(nil)
	return d.cfg.Trigger.Verify(TreeState{Nodes: nodes, Branches: len(open), MaxConf: t.maxLeafConf(), SumConf: sum(byDepth),
		ConfByDepth: byDepth, Handover: d.handover, LastGain: sum(d.last.byDepth), LastByDepth: d.last.byDepth,
		LastAdded: d.last.added, LastStep: d.last.time, Draft: d.roundDraft})
}

// openLeaves appends the leaves the draft may extend: open branches with
// room below them.
func (d *Decoder) openLeaves(dst []int) []int {
	if d.handover {
		return dst
	}
	deep := d.maxDepth()
	for _, l := range d.tree.leaves(nil) {
		if d.tree.nodes[l].depth < deep {
			dst = append(dst, l)
		}
	}
	return dst
}
