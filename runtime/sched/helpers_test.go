package sched

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// fakeClock is a manual clock for Config.Now. A cancelled context ends
// its request on another goroutine, which reads the clock too.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const fakeEOS = 2

// fakeEngine emits token 100+i as the i-th generated token of a sequence
// and EOS after lengths[tag] tokens (never when absent). Each Step moves
// the clock by stepA + stepB·members + stepC·prefill tokens.
type fakeEngine struct {
	name     string
	maxSeqs  int
	ctx      int
	chunk    int
	lengths  map[string]int
	seqs     map[SeqID]*fakeSeq
	next     SeqID
	clock    *fakeClock
	stepA    time.Duration
	stepB    time.Duration
	stepC    time.Duration
	batches  [][]string    // tags per step
	starts   []string      // tags started, in order
	perStep  int           // tokens per decoding member per step (default 1)
	delay    time.Duration // real sleep per step (live-mode tests)
	spin     time.Duration // real computation per step, never blocking (live-mode tests)
	spun     atomic.Int64  // steps that spun
	cpus     cpuset.Set    // reported in Info: the lane goroutine pins itself there
	hold     string        // a step with this tag waits for gate to close (live-mode tests)
	gate     chan struct{}
	failNext bool
}

type fakeSeq struct {
	tag     string
	pending int // context tokens left to prefill
	emitted int // tokens generated, over rebuilds (by tag)
	out     []int32
}

func newFakeEngine(clock *fakeClock) *fakeEngine {
	return &fakeEngine{name: "fake", maxSeqs: 16, ctx: 4096, chunk: 64, lengths: map[string]int{},
		seqs: map[SeqID]*fakeSeq{}, clock: clock, stepA: time.Millisecond, stepB: time.Millisecond, stepC: 10 * time.Microsecond}
}

func (e *fakeEngine) Info() EngineInfo {
	return EngineInfo{Name: e.name, MaxSeqs: e.maxSeqs, Context: e.ctx, SeqBytes: 1000, Threads: 1, CPUs: e.cpus}
}

// emittedBefore counts what earlier (evicted) sequences of tag produced.
var _ Engine = (*fakeEngine)(nil)

func (e *fakeEngine) Start(tokens []int32, _ *sample.Sampler, tag string) (SeqID, error) {
	if len(e.seqs) >= e.maxSeqs {
		return 0, fmt.Errorf("fake: all %d sequences in use", e.maxSeqs)
	}
	// A rebuild carries the prompt and the tokens generated so far;
	// tokens >= 100 are generated ones.
	gen := 0
	for _, t := range tokens {
		if t >= 100 {
			gen++
		}
	}
	e.next++
	e.seqs[e.next] = &fakeSeq{tag: tag, pending: len(tokens), emitted: gen}
	e.starts = append(e.starts, tag)
	return e.next, nil
}

func (e *fakeEngine) Free(id SeqID) error {
	if _, ok := e.seqs[id]; !ok {
		return fmt.Errorf("fake: free unknown sequence %d", id)
	}
	delete(e.seqs, id)
	return nil
}

func (e *fakeEngine) Step(_ context.Context, members []Member, out []StepOut) error {
	time.Sleep(e.delay)
	if e.spin > 0 {
		// What an engine step on one thread is: computation that never
		// gives the Go scheduler a chance to run anything else.
		for t0 := time.Now(); time.Since(t0) < e.spin; {
		}
		e.spun.Add(1)
	}
	if e.failNext {
		e.failNext = false
		return fmt.Errorf("fake: step failed")
	}
	for _, m := range members {
		if s := e.seqs[m.Seq]; s != nil && e.gate != nil && s.tag == e.hold {
			<-e.gate
		}
	}
	budget := e.chunk
	var tags []string
	decode, prefill := 0, 0
	for i, m := range members {
		s := e.seqs[m.Seq]
		out[i] = StepOut{}
		if s == nil {
			out[i].Err = fmt.Errorf("fake: unknown sequence %d", m.Seq)
			continue
		}
		tags = append(tags, s.tag)
		if s.pending > 0 {
			n := min(s.pending, budget)
			budget -= n
			s.pending -= n
			out[i].Prefilled = n
			prefill += n
			if s.pending > 0 || n == 0 {
				continue
			}
		} else {
			decode++
		}
		per := max(e.perStep, 1)
		s.out = s.out[:0]
		for k := 0; k < min(per, m.Limit); k++ {
			if l, ok := e.lengths[s.tag]; ok && s.emitted >= l {
				s.out = append(s.out, fakeEOS)
				break
			}
			s.out = append(s.out, int32(100+s.emitted))
			s.emitted++
		}
		out[i].Tokens = s.out
	}
	e.batches = append(e.batches, tags)
	if e.clock != nil {
		e.clock.Add(e.stepA + time.Duration(decode)*e.stepB + time.Duration(prefill)*e.stepC)
	}
	return nil
}

// newManual makes a manual scheduler on fake engines sharing one clock.
func newManual(t *testing.T, cfg Config, est *Estimator, engines ...*fakeEngine) (*Scheduler, *fakeClock) {
	t.Helper()
	clock := newClock()
	cfg.Manual = true
	cfg.Now = clock.Now
	var lanes []Lane
	for _, e := range engines {
		e.clock = clock
		lanes = append(lanes, Lane{Engine: e})
	}
	s, err := New(cfg, est, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// drive runs every lane until none has work; it fails after limit steps.
func drive(t *testing.T, s *Scheduler, limit int) int {
	t.Helper()
	steps := 0
	for {
		any := false
		for i := range s.lanes {
			st := s.Begin(i)
			if st == nil {
				continue
			}
			any = true
			st.Run(context.Background())
			s.End(st)
			steps++
			if steps > limit {
				t.Fatalf("still busy after %d steps", limit)
			}
		}
		if !any {
			return steps
		}
	}
}

// collect drains a finished stream: its tokens, text and result.
func collect(t *testing.T, st *Stream) ([]int32, string, *Result) {
	t.Helper()
	var toks []int32
	var text strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		toks = append(toks, ev.Tokens...)
		text.WriteString(ev.Text)
		if ev.Done {
			return toks, text.String(), ev.Result
		}
	}
}

func prompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(3 + i%90)
	}
	return p
}

// textDecoder renders token 100+i as a word from words (cycling).
type textDecoder struct{ words []string }

func (d *textDecoder) Next(id int32) string {
	if id < 100 {
		return ""
	}
	return d.words[int(id-100)%len(d.words)]
}
func (d *textDecoder) Flush() string { return "" }

// stepLane runs one step of lane i (which must have work).
func stepLane(s *Scheduler, i int) {
	st := s.Begin(i)
	st.Run(context.Background())
	s.End(st)
}

// lockstep starts sequences on an engine and steps them all together, as
// a lane steps its batch, collecting each one's tokens.
type lockstep struct {
	t *testing.T
	e interface {
		Engine
		ReusedTokens() int64
	}
	limit int // each member's Limit
	ids   []SeqID
	got   [][]int32
	out   []StepOut
	// prefilled and reused sum the steps' StepOut counts.
	prefilled, reused int
}

// start starts a sequence on ctx and returns the tokens its Start took
// from other sequences' rows.
func (l *lockstep) start(ctx []int32) (reused int) {
	l.t.Helper()
	before := l.e.ReusedTokens()
	id, err := l.e.Start(ctx, nil, "")
	if err != nil {
		l.t.Fatal(err)
	}
	l.ids, l.got, l.out = append(l.ids, id), append(l.got, nil), append(l.out, StepOut{})
	return int(l.e.ReusedTokens() - before)
}

// step steps every sequence once.
func (l *lockstep) step() {
	l.t.Helper()
	l.stepSome(func(int) bool { return true })
}

// stepSome steps the sequences that want says, together.
func (l *lockstep) stepSome(want func(i int) bool) {
	l.t.Helper()
	var members []Member
	var which []int
	for i, id := range l.ids {
		if want(i) {
			members, which = append(members, Member{Seq: id, Limit: l.limit}), append(which, i)
		}
	}
	out := l.out[:len(members)]
	if err := l.e.Step(context.Background(), members, out); err != nil {
		l.t.Fatal(err)
	}
	for k, o := range out {
		if o.Err != nil {
			l.t.Fatal(o.Err)
		}
		i := which[k]
		l.got[i] = append(l.got[i], o.Tokens...)
		l.prefilled += o.Prefilled
		l.reused += o.Reused
	}
}

// until steps the sequences short of n tokens together until none is:
// each runs until it has n, whatever the others do.
func (l *lockstep) until(n int) {
	l.t.Helper()
	short := func(i int) bool { return len(l.got[i]) < n }
	for slices.ContainsFunc(l.got, func(g []int32) bool { return len(g) < n }) {
		l.stepSome(short)
	}
}

// free frees every sequence.
func (l *lockstep) free() {
	l.t.Helper()
	for _, id := range l.ids {
		if err := l.e.Free(id); err != nil {
			l.t.Fatal(err)
		}
	}
}

// fuzzScript reads a fuzzer's bytes as a script of engine operations,
// and cuts the contexts it starts from a pool of earlier contexts and
// their answers, so that they share prefixes of every length with live
// and finished sequences.
type fuzzScript struct {
	ops  []byte
	pool [][]int32
}

// more reports whether bytes are left.
func (f *fuzzScript) more() bool { return len(f.ops) > 0 }

// next is the script's next byte, 0 once it has run out.
func (f *fuzzScript) next() byte {
	if len(f.ops) == 0 {
		return 0
	}
	b := f.ops[0]
	f.ops = f.ops[1:]
	return b
}

// context cuts a context of at most n tokens from the pool, maybe with a
// token of its own after it.
func (f *fuzzScript) context(n int) []int32 {
	p := f.pool[int(f.next())%len(f.pool)]
	ctx := slices.Clone(p[:1+int(f.next())%len(p)])
	if b := f.next(); b%2 == 1 {
		ctx = append(ctx, 2+int32(b)%400)
	}
	return ctx[:min(len(ctx), n)]
}

// finished adds a finished sequence's context and answer to the pool,
// which keeps the last eight.
func (f *fuzzScript) finished(ctx, answer []int32) {
	f.pool = append(f.pool, slices.Concat(ctx, answer))
	if len(f.pool) > 8 {
		f.pool = f.pool[1:]
	}
}

// shutdownWithin shuts a live scheduler down, cancelling what has not
// drained within d: a stalled request would hold a draining shutdown,
// and the test, for good.
func shutdownWithin(s *Scheduler, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s.Shutdown(ctx)
}
