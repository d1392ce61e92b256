package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/runtime/sample"
)

func submit(t *testing.T, s *Scheduler, r Request) *Stream {
	t.Helper()
	st, err := s.Submit(context.Background(), r)
	if err != nil {
		t.Fatalf("submit %s: %v", r.ID, err)
	}
	return st
}

func TestGenerateStopsAtEOSAndLength(t *testing.T) {
	e := newFakeEngine(nil)
	e.lengths["a"] = 5
	s, _ := newManual(t, Config{}, nil, e)
	a := submit(t, s, Request{ID: "a", Prompt: prompt(4), StopTokens: []int32{fakeEOS}})
	b := submit(t, s, Request{ID: "b", Prompt: prompt(4), MaxTokens: 3, StopTokens: []int32{fakeEOS}})
	drive(t, s, 100)
	toks, _, res := collect(t, a)
	if want := []int32{100, 101, 102, 103, 104}; !slices.Equal(toks, want) || res.Reason != ReasonStop || res.CompletionTokens != 5 {
		t.Errorf("a: tokens %v reason %v n %d, want %v stop 5", toks, res.Reason, res.CompletionTokens, want)
	}
	toks, _, res = collect(t, b)
	if len(toks) != 3 || res.Reason != ReasonLength {
		t.Errorf("b: tokens %v reason %v, want 3 tokens and length", toks, res.Reason)
	}
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences still allocated", len(e.seqs))
	}
}

func TestContinuousBatchingJoinsAndLeavesAtTokenBoundaries(t *testing.T) {
	e := newFakeEngine(nil)
	e.lengths["long"] = 40
	e.lengths["short"] = 3
	s, _ := newManual(t, Config{Policy: FIFO, MaxBatch: 2}, nil, e)
	long := submit(t, s, Request{ID: "long", Prompt: prompt(4), StopTokens: []int32{fakeEOS}})
	// Two steps in, a short request arrives and joins the running batch.
	for range 2 {
		st := s.Begin(0)
		st.Run(context.Background())
		s.End(st)
	}
	short := submit(t, s, Request{ID: "short", Prompt: prompt(4), StopTokens: []int32{fakeEOS}})
	drive(t, s, 200)
	_, _, rs := collect(t, short)
	_, _, rl := collect(t, long)
	if !rs.Finish.Before(rl.Finish) {
		t.Errorf("short finished at %v, not before long at %v: it waited for the longest member", rs.Finish, rl.Finish)
	}
	joined := -1
	for i, b := range e.batches {
		if len(b) > 2 {
			t.Fatalf("step %d has %d members, MaxBatch is 2", i, len(b))
		}
		if joined < 0 && slices.Contains(b, "short") {
			joined = i
			if !slices.Contains(b, "long") {
				t.Errorf("short did not join the long request's batch")
			}
		}
	}
	if joined != 2 {
		t.Errorf("short joined at step %d, want 2 (the next token boundary)", joined)
	}
}

// order runs requests through a one-member lane and returns their
// completion order.
func order(t *testing.T, cfg Config, reqs []Request, lengths map[string]int) []string {
	t.Helper()
	e := newFakeEngine(nil)
	e.lengths = lengths
	cfg.MaxBatch = 1
	s, clock := newManual(t, cfg, nil, e)
	var streams []*Stream
	for _, r := range reqs {
		r.StopTokens = []int32{fakeEOS}
		streams = append(streams, submit(t, s, r))
		clock.Add(time.Microsecond)
	}
	drive(t, s, 10000)
	var got []string
	type fin struct {
		id string
		at time.Time
	}
	var fins []fin
	for _, st := range streams {
		_, _, r := collect(t, st)
		fins = append(fins, fin{r.ID, r.Finish})
	}
	slices.SortFunc(fins, func(a, b fin) int { return a.at.Compare(b.at) })
	for _, f := range fins {
		got = append(got, f.id)
	}
	return got
}

func TestPolicyOrders(t *testing.T) {
	// Prompt length is the (uncalibrated) score: a 60, b 5, c 20 tokens.
	reqs := []Request{
		{ID: "a", Prompt: prompt(60), MaxTokens: 60},
		{ID: "b", Prompt: prompt(5), MaxTokens: 5, Deadline: 900 * time.Millisecond},
		{ID: "c", Prompt: prompt(20), MaxTokens: 20, Deadline: 300 * time.Millisecond},
	}
	lengths := map[string]int{"a": 60, "b": 5, "c": 20}
	for _, tc := range []struct {
		p    Policy
		want []string
	}{
		{FIFO, []string{"a", "b", "c"}},
		{LUF, []string{"b", "c", "a"}},
		{EDF, []string{"c", "b", "a"}}, // a's implicit deadline r + φ·60 is the latest
	} {
		t.Run(tc.p.String(), func(t *testing.T) {
			if got := order(t, Config{Policy: tc.p}, reqs, lengths); !slices.Equal(got, tc.want) {
				t.Errorf("order %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConfigDefaults: zero, out-of-range and NaN tuning values take the
// defaults (NaN slipped past checks written as x < lo).
func TestConfigDefaults(t *testing.T) {
	nan := math.NaN()
	for _, c := range []Config{{}, {Lookahead: nan, Lambda: nan, Alpha: nan, TauQuantile: nan}, {Lookahead: math.Inf(1), Lambda: 0.5, Alpha: 2, TauQuantile: -1}} {
		c.defaults()
		if c.Lookahead != 2 || c.Lambda != 4 || c.Alpha != 0.5 || c.TauQuantile != 0.9 {
			t.Errorf("defaults: lookahead %v, lambda %v, alpha %v, tau quantile %v; want 2, 4, 0.5, 0.9", c.Lookahead, c.Lambda, c.Alpha, c.TauQuantile)
		}
	}
	// A tandem scheduler configured with NaN orders requests as the
	// default one does.
	reqs := []Request{
		{ID: "a", Prompt: prompt(60), MaxTokens: 60},
		{ID: "b", Prompt: prompt(5), MaxTokens: 5, Deadline: 900 * time.Millisecond},
		{ID: "c", Prompt: prompt(20), MaxTokens: 20, Deadline: 300 * time.Millisecond},
	}
	lengths := map[string]int{"a": 60, "b": 5, "c": 20}
	want := order(t, Config{Policy: Tandem}, reqs, lengths)
	if got := order(t, Config{Policy: Tandem, Lookahead: nan, Lambda: nan, Alpha: nan, TauQuantile: nan}, reqs, lengths); !slices.Equal(got, want) {
		t.Errorf("order with NaN tuning %v, want the default's %v", got, want)
	}
}

func TestStrictPriorityClass(t *testing.T) {
	reqs := []Request{
		{ID: "first", Prompt: prompt(4), MaxTokens: 4},
		{ID: "low", Prompt: prompt(4), MaxTokens: 4, Priority: -1},
		{ID: "normal", Prompt: prompt(4), MaxTokens: 4},
		{ID: "high", Prompt: prompt(4), MaxTokens: 4, Priority: 5},
	}
	for _, p := range Policies() {
		got := order(t, Config{Policy: p}, reqs, nil)
		if want := []string{"high", "first", "normal", "low"}; !slices.Equal(got, want) {
			t.Errorf("%v: order %v, want %v", p, got, want)
		}
	}
}

func TestTandemPriorityPrefersShortAndUrgent(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{}, nil, e)
	l := s.lanes[0]
	now := s.cfg.Now()
	mk := func(score float64, dl time.Duration) *task {
		tk := &task{score: score, promptLen: 10, arrival: now, relDL: dl}
		if dl > 0 {
			tk.deadline = now.Add(dl)
		}
		return tk
	}
	for _, x := range []float64{5, 50, 500} {
		s.quant.add(x)
	}
	// With equal slack (d - now - η·u), the less uncertain request wins.
	eta := l.cost.perToken(1)
	short, long := mk(5, time.Second), mk(400, time.Second+395*eta)
	if s.tandemPriority(short, l, now) <= s.tandemPriority(long, l, now) {
		t.Errorf("short request does not outrank long one with the same slack")
	}
	urgent, relaxed := mk(50, 100*time.Millisecond), mk(50, 10*time.Second)
	if s.tandemPriority(urgent, l, now) <= s.tandemPriority(relaxed, l, now) {
		t.Errorf("urgent request does not outrank relaxed one")
	}
	// Aging: a waiting request's priority grows as time passes, also past
	// the slack clamp.
	p0 := s.tandemPriority(long, l, now)
	p1 := s.tandemPriority(long, l, now.Add(2*time.Second))
	p2 := s.tandemPriority(long, l, now.Add(20*time.Second))
	if !(p0 < p1 && p1 < p2) {
		t.Errorf("priority does not grow with waiting: %v, %v, %v", p0, p1, p2)
	}
	// Past the clamp, waiting outweighs the score: a request overdue by
	// agingSteps more decode steps outranks one with a far smaller score,
	// however long both have waited (the published form multiplies the
	// aging by the numerator, so the small score won forever).
	for _, wait := range []time.Duration{0, time.Minute, time.Hour} {
		at := now.Add(wait)
		older := mk(500, time.Millisecond)
		newer := mk(5, time.Millisecond)
		newer.deadline = newer.deadline.Add(time.Duration(agingSteps) * eta)
		if s.tandemPriority(older, l, at) <= s.tandemPriority(newer, l, at) {
			t.Errorf("after %v: a request overdue by %d more steps does not outrank a less uncertain one", wait, agingSteps)
		}
	}
	for _, tk := range []*task{short, long, urgent, relaxed} {
		if p := s.tandemPriority(tk, l, now); !(p > 0) {
			t.Errorf("normalised priority %v is not positive", p)
		}
	}
}

func TestRTLMPublishedFlipsSign(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{Policy: RTLM}, nil, e)
	l := s.lanes[0]
	now := s.cfg.Now()
	for range 100 {
		s.quant.add(20)
	}
	mk := func(score float64) *task {
		return &task{score: score, promptLen: 10, arrival: now, deadline: now.Add(10 * time.Second), relDL: 10 * time.Second}
	}
	normal, huge := mk(20), mk(200) // huge: 10× the 99th percentile
	if p := s.rtlmPriority(normal, l, now); !(p > 0) {
		t.Errorf("published priority of a typical request %v, want > 0", p)
	}
	if p := s.rtlmPriority(huge, l, now); !(p < 0) {
		t.Errorf("published priority of a long request %v, want < 0 (the sign flip)", p)
	}
	if p := s.tandemPriority(huge, l, now); !(p > 0) {
		t.Errorf("normalised priority of the long request %v, want > 0", p)
	}
}

func TestConsolidationCutsAtUncertaintyJump(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{MaxBatch: 4, Lambda: 4}, nil, e)
	mk := func(id string, score float64) *task { return &task{id: id, score: score} }
	// In priority order; the most urgent has u=10.
	cands := []*task{mk("a", 10), mk("b", 200), mk("c", 12), mk("d", 30), mk("e", 15), mk("f", 220)}
	got := s.consolidate(cands)
	var ids []string
	for _, tk := range got {
		ids = append(ids, tk.id)
	}
	// Sorted by u: 10 12 15 30 | 200 220 (30→200 is a jump > 4×). The
	// group holding "a" is taken in priority order.
	if want := []string{"a", "c", "d", "e"}; !slices.Equal(ids, want) {
		t.Errorf("consolidated %v, want %v", ids, want)
	}
	// A group also ends at C members.
	s.cfg.MaxBatch = 2
	got = s.consolidate(cands)
	if len(got) != 2 || got[0].id != "a" || got[1].id != "c" {
		t.Errorf("with C=2 got %d members starting %s", len(got), got[0].id)
	}
}

func TestRoutingSendsLongRequestsToSecondaryLane(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	s, _ := newManual(t, Config{}, nil, e0, e1)
	for i := range 20 {
		e0.lengths[strconv.Itoa(i+1)], e1.lengths[strconv.Itoa(i+1)] = 2, 2
	}
	var streams []*Stream
	for i := range 20 {
		n := 5
		if i%10 == 9 {
			n = 300 // two in twenty are long
		}
		streams = append(streams, submit(t, s, Request{Prompt: prompt(n), MaxTokens: 400, StopTokens: []int32{fakeEOS}}))
	}
	drive(t, s, 1000)
	lanes := map[int]int{}
	for i, st := range streams {
		_, _, r := collect(t, st)
		if long := i%10 == 9; long {
			if r.Lane != 1 {
				t.Errorf("request %d (score %.0f) ran on lane %d, want the secondary lane", i, r.Score, r.Lane)
			}
		} else {
			lanes[r.Lane]++
		}
	}
	// Work conservation: the secondary lane, done with its long requests,
	// takes short ones from the primary's queue instead of idling.
	if lanes[1] == 0 || lanes[0] == 0 {
		t.Errorf("short requests per lane %v: want both lanes used", lanes)
	}
}

func TestPrimaryLaneTakesRoutedRequestOnceItOutranksItsOwn(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	s, clock := newManual(t, Config{MaxBatch: 1}, nil, e0, e1)
	for range 10 {
		submit(t, s, Request{Prompt: prompt(2), MaxTokens: 2})
	}
	// Uncalibrated, a request's score is its prompt length: these two are
	// routed to the secondary lane, which runs one of them for long.
	busy := submit(t, s, Request{ID: "busy", Prompt: prompt(30), MaxTokens: 400})
	for range 100 {
		if len(s.queues[0]) == 0 && len(s.lanes[0].running) == 0 {
			break
		}
		for i := range s.lanes {
			if st := s.Begin(i); st != nil {
				st.Run(context.Background())
				s.End(st)
			}
		}
	}
	if len(s.queues[0]) != 0 || len(s.lanes[0].running) != 0 || s.tasks["busy"].state != running || s.tasks["busy"].lane != 1 {
		t.Fatalf("setup: the primary lane is not idle, or the long request is not running on the secondary lane")
	}
	submit(t, s, Request{ID: "waiting", Prompt: prompt(30), MaxTokens: 400})
	if w := s.tasks["waiting"]; w.qi != 1 {
		t.Fatalf("setup: the second long request is in queue %d, want the secondary's", w.qi)
	}
	// It waits a minute behind the busy secondary; then a short request
	// arrives for the primary. The long one is overdue by far more: the
	// primary takes it rather than leave it to a lane that is not free.
	clock.Add(time.Minute)
	submit(t, s, Request{ID: "fresh", Prompt: prompt(2), MaxTokens: 2})
	st := s.Begin(0)
	if got := stepIDs(st); len(got) != 1 || got[0] != "waiting" {
		t.Fatalf("primary lane runs %v, want the long request that waited a minute", got)
	}
	st.Run(context.Background())
	s.End(st)
	_ = busy
}

// TestSecondaryLaneTakesAnUrgentDeadlineFromThePrimary: a secondary lane
// whose own queue holds a long request takes a request with a deadline at
// stake from the primary's queue first, while the primary is busy; a
// request without a deadline it leaves there.
func TestSecondaryLaneTakesAnUrgentDeadlineFromThePrimary(t *testing.T) {
	// The secondary takes a planner from the primary's queue before its
	// own long request when the planner's deadline is at stake: it can
	// meet it, or (due in a microsecond, a few steps too soon) it will
	// miss it but its utility lasts a second longer. With the default
	// utility, gone a microsecond after that deadline, or without a
	// deadline, nothing is at stake and the secondary serves its own.
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		utility  Utility
		want     string
	}{
		{"meetable deadline", 10 * time.Second, Utility{}, "planner"},
		{"late, utility left", time.Microsecond, Utility{Value: 1, Slope: 1}, "planner"},
		{"late, no utility left", time.Microsecond, Utility{}, "long1"},
		{"no deadline", 0, Utility{}, "long1"},
	} {
		e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
		s, _ := newManual(t, Config{MaxBatch: 1}, nil, e0, e1)
		serveShortOnPrimary(t, s)
		// Uncalibrated, a score is the prompt length: both long requests
		// are routed to the secondary's queue; the idle primary takes the
		// first, the second waits for the secondary.
		submit(t, s, Request{ID: "long0", Prompt: prompt(30), MaxTokens: 400})
		if st := s.Begin(0); st == nil || st.tasks[0].id != "long0" {
			t.Fatal("setup: the primary did not take the first long request")
		}
		submit(t, s, Request{ID: "long1", Prompt: prompt(30), MaxTokens: 400})
		submit(t, s, Request{ID: "planner", Prompt: prompt(2), MaxTokens: 2, Deadline: tc.deadline, Utility: tc.utility})
		if s.tasks["long1"].qi != 1 || s.tasks["planner"].qi != 0 {
			t.Fatalf("setup: queues %d and %d, want the long request in the secondary's and the planner in the primary's",
				s.tasks["long1"].qi, s.tasks["planner"].qi)
		}
		st := s.Begin(1)
		if got := stepIDs(st); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: the secondary lane runs %v, want %s", tc.name, got, tc.want)
		}
	}
}

// TestSecondaryLaneGoesOnWithWhatItPreempted: a request preempted on the
// secondary lane waits in that lane's queue with its sequence there, so no
// other lane can run it. When the primary's backlog grows past twice the
// secondary's and the secondary serves it instead, the preempted request
// still goes on once it outranks that backlog, not after it.
func TestSecondaryLaneGoesOnWithWhatItPreempted(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	s, clock := newManual(t, Config{MaxBatch: 1}, nil, e0, e1)
	serveShortOnPrimary(t, s)
	step := func(i int, want string) {
		t.Helper()
		st := s.Begin(i)
		if got := stepIDs(st); len(got) != 1 || got[0] != want {
			t.Fatalf("lane %d runs %v, want %s", i, got, want)
		}
		st.Run(context.Background())
		s.End(st)
	}
	// The primary runs one long request for good; the secondary another.
	submit(t, s, Request{ID: "long0", Prompt: prompt(30), MaxTokens: 400})
	step(0, "long0")
	submit(t, s, Request{ID: "mine", Prompt: prompt(30), MaxTokens: 400})
	for range 3 {
		step(1, "mine")
	}
	// An urgent request routed to the secondary (its prompt is longer)
	// preempts it; it stops after three tokens.
	e1.lengths["urgent"] = 3
	submit(t, s, Request{ID: "urgent", Prompt: prompt(40), MaxTokens: 400, Deadline: 5 * time.Minute, StopTokens: []int32{fakeEOS}})
	step(1, "urgent")
	if m := s.tasks["mine"]; m.state != waiting || !m.hasSeq || m.lane != 1 || m.qi != 1 {
		t.Fatalf("setup: mine is %v on lane %d in queue %d (sequence kept %v), want waiting in the secondary's queue with its sequence", m.state, m.lane, m.qi, m.hasSeq)
	}
	// A minute later (it has aged past fresh requests) the primary's
	// queue grows far past the secondary's.
	clock.Add(time.Minute)
	for i := range 40 {
		submit(t, s, Request{ID: "short" + strconv.Itoa(i), Prompt: prompt(2), MaxTokens: 2})
	}
	if src := s.source(s.lanes[1]); src != 0 {
		t.Fatalf("setup: the secondary admits from queue %d, want the primary's backlog", src)
	}
	for range 3 {
		step(1, "urgent")
	}
	step(1, "mine")
}

func TestSecondaryLaneKeepsItsBatchForARunningDeadline(t *testing.T) {
	// The secondary runs three long answers and a request with a deadline
	// routed to it; then its steps get four times as costly. On the
	// primary, preemption would move the long answers out for the
	// deadline (TestPreemptionMakesRoomForARunningDeadline); the
	// secondary keeps its batch: deadlines get small batches on the
	// primary, and cutting the secondary's slowed the long answers that
	// set the tail.
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	s, _ := newManual(t, Config{MaxBatch: 4}, nil, e0, e1)
	for i := range 2 {
		s.SeedCost(i, 0, 10*time.Millisecond, 0)
	}
	for _, e := range []*fakeEngine{e0, e1} {
		e.stepA, e.stepB = 0, 10*time.Millisecond
	}
	serveShortOnPrimary(t, s)
	// Each prompt longer than the last, so each is above the routing
	// quantile of the scores before it: all go to the secondary.
	for i := range 3 {
		submit(t, s, Request{ID: "long" + strconv.Itoa(i), Prompt: prompt(30 + 2*i), MaxTokens: 200})
	}
	e1.lengths["urgent"] = 40
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(40), MaxTokens: 200, Deadline: 3500 * time.Millisecond, StopTokens: []int32{fakeEOS}})
	for _, id := range []string{"long0", "long1", "long2", "urgent"} {
		if tk := s.tasks[id]; tk.qi != 1 {
			t.Fatalf("setup: %s waits in queue %d, want the secondary's", id, tk.qi)
		}
	}
	stepLane(s, 1)
	stepLane(s, 1)
	if got := len(e1.batches[len(e1.batches)-1]); got != 4 {
		t.Fatalf("the secondary runs a batch of %d, want 4: the scenario needs the urgent request beside the long ones", got)
	}
	e1.stepB = 40 * time.Millisecond
	for range 100 {
		stepLane(s, 1)
	}
	if n := s.Stats().Preempted; n != 0 {
		t.Errorf("the secondary preempted %d members for a running deadline, want none", n)
	}
	if r := urgent.Result(); r == nil || r.CompletionTokens != 40 {
		t.Errorf("urgent: %+v, want its 40 tokens in the secondary's batch", r)
	}
}

// stepIDs is the ids of st's members, in batch order (none for nil).
func stepIDs(st *Step) []string {
	var got []string
	if st != nil {
		for _, tk := range st.tasks {
			got = append(got, tk.id)
		}
	}
	return got
}

// serveShortOnPrimary runs ten short requests to their end on lane 0, so
// the routing quantile has scores: a longer prompt is routed to lane 1.
func serveShortOnPrimary(t *testing.T, s *Scheduler) {
	t.Helper()
	for range 10 {
		submit(t, s, Request{Prompt: prompt(2), MaxTokens: 2})
	}
	for range 100 {
		if len(s.queues[0]) == 0 && len(s.lanes[0].running) == 0 {
			return
		}
		if st := s.Begin(0); st != nil {
			st.Run(context.Background())
			s.End(st)
		}
	}
	t.Fatal("setup: the primary lane did not serve ten short requests")
}

// TestSecondaryLaneFillsFreeSlotsFromThePrimary: routing keeps long
// requests off the primary, but a secondary lane with room left after its
// own queue takes short requests waiting for the primary rather than idle
// beside them.
func TestSecondaryLaneFillsFreeSlotsFromThePrimary(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	s, _ := newManual(t, Config{MaxBatch: 3}, nil, e0, e1)
	serveShortOnPrimary(t, s)
	submit(t, s, Request{ID: "long", Prompt: prompt(30), MaxTokens: 400})
	submit(t, s, Request{ID: "short0", Prompt: prompt(2), MaxTokens: 2})
	submit(t, s, Request{ID: "short1", Prompt: prompt(2), MaxTokens: 2})
	submit(t, s, Request{ID: "short2", Prompt: prompt(2), MaxTokens: 2})
	if s.tasks["long"].qi != 1 || s.tasks["short0"].qi != 0 {
		t.Fatalf("setup: queues %d and %d, want the long request in the secondary's and the short ones in the primary's",
			s.tasks["long"].qi, s.tasks["short0"].qi)
	}
	got := stepIDs(s.Begin(1))
	if want := []string{"long", "short0", "short1"}; !slices.Equal(got, want) {
		t.Errorf("the secondary lane runs %v, want its own long request first and two short ones in its free slots: %v", got, want)
	}
}

// TestSlowLaneTakesOnlyWhatPays: a secondary lane 30 times slower than
// the primary (a CPU lane beside a GPU) is not routed long requests, and
// takes only what it would finish before the primary could: nothing while
// the primary is free, short requests once it is backed up, never the
// long one. A lane about as fast as the primary takes whatever routing
// and its free slots give it (TestSecondaryLaneFillsFreeSlotsFromThePrimary).
func TestSlowLaneTakesOnlyWhatPays(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	e1.stepA, e1.stepB = 30*time.Millisecond, 30*time.Millisecond
	s, _ := newManual(t, Config{MaxBatch: 2}, nil, e0, e1)
	s.SeedCost(0, time.Millisecond, time.Millisecond, 10*time.Microsecond)
	s.SeedCost(1, 30*time.Millisecond, 30*time.Millisecond, 10*time.Microsecond)
	serveShortOnPrimary(t, s)
	submit(t, s, Request{ID: "alone", Prompt: prompt(2), MaxTokens: 2})
	if got := stepIDs(s.Begin(1)); len(got) != 0 {
		t.Fatalf("the slow lane took %v while the primary was free", got)
	}
	submit(t, s, Request{ID: "long", Prompt: prompt(30), MaxTokens: 400})
	if q := s.tasks["long"].qi; q != 0 {
		t.Errorf("the long request went to queue %d, want the primary's: the slow lane would take 30 times as long", q)
	}
	// 100 short requests back the primary up by about 0.3 s: two tokens
	// on the slow lane (0.18 s at a batch of 2) beat that wait, the long
	// request's 30 (2.7 s) do not.
	for i := range 100 {
		submit(t, s, Request{ID: "short" + strconv.Itoa(i), Prompt: prompt(2), MaxTokens: 2})
	}
	got := stepIDs(s.Begin(1))
	if len(got) != 2 || slices.Contains(got, "long") {
		t.Errorf("the slow lane runs %v, want two short requests and not the long one", got)
	}
}

// TestMuchSlowerLaneIsRoutedTheShortest: a second lane three times slower
// than the primary is routed the shortest requests without deadlines, up
// to its quarter of the predicted work, and never a long one or one with
// a deadline; a second lane as fast as the primary is routed the long
// ones (the τ quantile).
func TestMuchSlowerLaneIsRoutedTheShortest(t *testing.T) {
	for _, slower := range []time.Duration{3, 1} {
		s, _ := newManual(t, Config{MaxBatch: 2}, nil, newFakeEngine(nil), newFakeEngine(nil))
		s.SeedCost(0, time.Millisecond, time.Millisecond, 10*time.Microsecond)
		s.SeedCost(1, slower*time.Millisecond, slower*time.Millisecond, 10*time.Microsecond)
		serveShortOnPrimary(t, s)
		var work [2]float64
		for i := range 40 {
			r := Request{ID: "short" + strconv.Itoa(i), Prompt: prompt(2 + i%3), MaxTokens: 8}
			switch {
			case i%4 == 3:
				r.ID, r.Prompt, r.MaxTokens = "long"+strconv.Itoa(i), prompt(30), 400
			case i%4 == 2:
				r.ID, r.Deadline = "deadline"+strconv.Itoa(i), time.Second
			}
			submit(t, s, r)
			tk := s.tasks[r.ID]
			work[tk.qi] += tk.score
			switch {
			case slower == 1 && r.ID == "long3" && tk.qi != 1:
				t.Errorf("alike lanes: the first long request went to queue %d, want the second lane's", tk.qi)
			case slower > 1 && tk.qi == 1 && (strings.HasPrefix(r.ID, "long") || r.Deadline > 0):
				t.Errorf("%s went to the slow lane's queue", r.ID)
			}
		}
		if share := work[1] / (work[0] + work[1]); slower > 1 && (share < 0.1 || share > 0.3) {
			t.Errorf("the slow lane was routed %.0f%% of the predicted work, want about its quarter", 100*share)
		}
	}
}

// TestUnmeasuredLaneIsNotMuchSlower: a lane whose costs are still the
// prior (it has not run, nor been seeded) is not taken for a much slower
// one beside a measured lane; once its costs are known it is compared.
func TestUnmeasuredLaneIsNotMuchSlower(t *testing.T) {
	s, _ := newManual(t, Config{MaxBatch: 2}, nil, newFakeEngine(nil), newFakeEngine(nil))
	s.SeedCost(0, 10*time.Microsecond, 30*time.Microsecond, time.Microsecond)
	slow := func() []bool {
		var got []bool
		for _, l := range s.Stats().Lanes {
			got = append(got, l.MuchSlower)
		}
		return got
	}
	if got := slow(); got[0] || got[1] {
		t.Errorf("much slower: %v, want neither while lane 1 is unmeasured", got)
	}
	s.SeedCost(1, 30*time.Microsecond, 90*time.Microsecond, time.Microsecond)
	if got := slow(); got[0] || !got[1] {
		t.Errorf("much slower: %v, want lane 1 once its costs say three times slower", got)
	}
}

// TestNewRequestWakesAnIdleLane: a request routed to a busy lane's queue
// wakes the other lanes too, so an idle one serves it instead of
// sleeping until the busy lane next plans.
func TestNewRequestWakesAnIdleLane(t *testing.T) {
	gate := make(chan struct{})
	var lanes []Lane
	for range 2 {
		e := newFakeEngine(nil)
		e.hold, e.gate = "held", gate // whichever lane takes "held" stays in its step
		lanes = append(lanes, Lane{Engine: e})
	}
	s, err := New(Config{MaxBatch: 4}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	defer close(gate)
	held := submit(t, s, Request{ID: "held", Prompt: prompt(2), MaxTokens: 2})
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.tasks["held"].state == running && (s.lanes[0].busy || s.lanes[1].busy)
	})
	// Uncalibrated and without scores, every request is routed to the
	// primary's queue, whichever lane is busy.
	short := submit(t, s, Request{ID: "short", Prompt: prompt(2), MaxTokens: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := short.Wait(ctx)
	if err != nil {
		t.Fatalf("the short request waited for the busy lane: %v", err)
	}
	if r := held.Result(); r != nil {
		t.Fatalf("the held request ended before its step was let go: %+v", r)
	}
	if res.Reason != ReasonLength || res.CompletionTokens != 2 {
		t.Errorf("short request: %+v", res)
	}
}

// TestSlowLaneWakesTheLaneItLeavesARequestTo: a lane much slower than
// another leaves it a request, and wakes it to take it. Here lane 0 is
// the slow one when the request arrives, so it leaves it to lane 1, busy
// in a step, and sleeps. While that step runs, the costs turn round (a
// lane's measured cost moves with its load), so lane 1, once free, leaves
// the request to lane 0 in turn: without a wake-up no lane served it.
func TestSlowLaneWakesTheLaneItLeavesARequestTo(t *testing.T) {
	gate := make(chan struct{})
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	e1.hold, e1.gate = "busy", gate
	s, err := New(Config{MaxBatch: 1}, nil, Lane{Engine: e0}, Lane{Engine: e1})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownWithin(s, time.Second)
	slow, fast := 10*time.Millisecond, time.Millisecond
	s.SeedCost(0, slow, slow, time.Microsecond)
	s.SeedCost(1, fast, fast, time.Microsecond)
	busy := submit(t, s, Request{ID: "busy", Prompt: prompt(2), MaxTokens: 1})
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.tasks["busy"].state == running && s.tasks["busy"].lane == 1 && s.lanes[1].busy
	})
	late := submit(t, s, Request{ID: "late", Prompt: prompt(2), MaxTokens: 2})
	// Lane 0 plans at once and leaves it; give it time to go back to sleep.
	time.Sleep(100 * time.Millisecond)
	if r := late.Result(); r != nil {
		t.Fatalf("setup: the slow lane served the late request: %+v", r)
	}
	s.SeedCost(0, fast, fast, time.Microsecond)
	s.SeedCost(1, slow, slow, time.Microsecond)
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := busy.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := late.Wait(ctx)
	if err != nil {
		t.Fatalf("the late request was never served (%d waiting, every lane idle for %v): %v", s.Stats().Waiting, s.Stats().Stalled, err)
	}
	if res.Lane != 0 || res.CompletionTokens != 2 {
		t.Errorf("late request: %d tokens on lane %d, want 2 on lane 0", res.CompletionTokens, res.Lane)
	}
}

func TestAdmissionControlProtectsUrgentDeadline(t *testing.T) {
	e := newFakeEngine(nil)
	e.stepA, e.stepB = 0, 10*time.Millisecond // a step costs 10ms per member
	s, _ := newManual(t, Config{MaxBatch: 4}, nil, e)
	s.SeedCost(0, 0, 10*time.Millisecond, 0)
	// 20 tokens at 10 ms per member-step: alone it needs 200 ms, with a
	// second member 400 ms. The deadline is 260 ms: 13 ms a token, below
	// what batchCap plans for (10 ms ÷ deadlineShare), so the batch stays
	// at 4 and admission control alone must hold the second request back.
	// The uncalibrated estimate is the prompt length: 20, right here.
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 260 * time.Millisecond})
	st := s.Begin(0)
	st.Run(context.Background())
	s.End(st)
	other := submit(t, s, Request{ID: "other", Prompt: prompt(2), MaxTokens: 20})
	drive(t, s, 1000)
	_, _, ru := collect(t, urgent)
	_, _, ro := collect(t, other)
	if !ru.DeadlineMet {
		t.Errorf("urgent request missed its deadline (finished %v after arrival)", ru.Finish.Sub(ru.Arrival))
	}
	// It joins once the urgent request can afford a second member.
	if join := ro.FirstToken.Sub(ru.Arrival); join < 50*time.Millisecond || ro.CompletionTokens != 20 {
		t.Errorf("other request joined %v after the urgent one and got %d tokens: want a deferred join and a full answer", join, ro.CompletionTokens)
	}
	if s.Stats().Deferred == 0 {
		t.Errorf("no admission was deferred")
	}

	// Without admission control both share the lane and the deadline is
	// missed: the test above is not passing by accident.
	e2 := newFakeEngine(nil)
	e2.stepA, e2.stepB = 0, 10*time.Millisecond
	s2, _ := newManual(t, Config{MaxBatch: 4, Ablate: Ablation{NoAdmission: true, NoShedding: true}}, nil, e2)
	u2 := submit(t, s2, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 260 * time.Millisecond})
	st = s2.Begin(0)
	st.Run(context.Background())
	s2.End(st)
	submit(t, s2, Request{ID: "other", Prompt: prompt(2), MaxTokens: 20})
	drive(t, s2, 1000)
	if _, _, r := collect(t, u2); r.DeadlineMet {
		t.Errorf("without admission control the urgent request still met its deadline; the scenario tests nothing")
	}
}

func TestSheddingKeepsDeadlinesAndReportsShedTokens(t *testing.T) {
	e := newFakeEngine(nil)
	e.stepA, e.stepB = 0, 10*time.Millisecond
	s, _ := newManual(t, Config{MaxBatch: 2}, nil, e)
	s.SeedCost(0, 0, 10*time.Millisecond, 0)
	// A background summary with a mandatory 5 and an optional 95 tokens
	// and low utility runs; an urgent request arrives that cannot make
	// its deadline sharing the lane.
	bg := submit(t, s, Request{ID: "bg", Prompt: prompt(2), MinTokens: 5, MaxTokens: 100, Utility: Utility{Value: 0.1}})
	for range 10 {
		st := s.Begin(0)
		st.Run(context.Background())
		s.End(st)
	}
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 250 * time.Millisecond})
	drive(t, s, 1000)
	toks, _, rb := collect(t, bg)
	_, _, ru := collect(t, urgent)
	if rb.Reason != ReasonShed || rb.ShedTokens != 100-len(toks) || len(toks) < 5 {
		t.Errorf("background: reason %v, %d tokens, shed %d; want shed after >= 5 tokens with shed = 100 - generated", rb.Reason, len(toks), rb.ShedTokens)
	}
	if !ru.DeadlineMet {
		t.Errorf("urgent missed its deadline: %v", ru.Finish.Sub(ru.Arrival))
	}
	if st := s.Stats(); st.ShedRequests != 1 || st.ShedTokens != uint64(rb.ShedTokens) {
		t.Errorf("stats shed %d requests %d tokens", st.ShedRequests, st.ShedTokens)
	}
}

func TestCancelFreesSequence(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{}, nil, e)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := s.Submit(ctx, Request{Prompt: prompt(3)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		step := s.Begin(0)
		step.Run(context.Background())
		s.End(step)
	}
	if len(e.seqs) != 1 {
		t.Fatalf("%d sequences allocated, want 1", len(e.seqs))
	}
	cancel()
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.lanes[0].running) == 0 || s.lanes[0].running[0].cancel != nil
	})
	drive(t, s, 10)
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences still allocated after cancel", len(e.seqs))
	}
	_, _, r := collect(t, st)
	if r.Reason != ReasonCancelled || !errors.Is(r.Err, context.Canceled) {
		t.Errorf("reason %v err %v, want cancelled", r.Reason, r.Err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestQueueFull(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{MaxQueue: 2}, nil, e)
	submit(t, s, Request{Prompt: prompt(2)})
	submit(t, s, Request{Prompt: prompt(2)})
	if _, err := s.Submit(context.Background(), Request{Prompt: prompt(2)}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third submit: %v, want ErrQueueFull", err)
	}
	if d := s.RetryAfter(); d < time.Second || d > time.Minute {
		t.Errorf("retry after %v, want 1s..1m", d)
	}
}

func TestSubmitRejectsBadRequests(t *testing.T) {
	e := newFakeEngine(nil)
	e.ctx = 64
	s, _ := newManual(t, Config{}, nil, e)
	for _, tc := range []struct {
		name string
		r    Request
		want error
	}{
		{"empty prompt", Request{}, ErrInvalid},
		{"negative max", Request{Prompt: prompt(2), MaxTokens: -1}, ErrInvalid},
		{"min over max", Request{Prompt: prompt(2), MaxTokens: 3, MinTokens: 4}, ErrInvalid},
		{"negative deadline", Request{Prompt: prompt(2), Deadline: -time.Second}, ErrInvalid},
		{"absurd deadline", Request{Prompt: prompt(2), Deadline: 1000 * time.Hour}, ErrInvalid},
		{"priority", Request{Prompt: prompt(2), Priority: 11}, ErrInvalid},
		{"stop without decoder", Request{Prompt: prompt(2), StopText: []string{"x"}}, ErrInvalid},
		{"prompt over context", Request{Prompt: prompt(64)}, ErrContextFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Submit(context.Background(), tc.r); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestStopTextIsHeldBackAndCut(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{}, nil, e)
	dec := &textDecoder{words: []string{"one ", "two ", "thr", "ee ", "four "}}
	st := submit(t, s, Request{Prompt: prompt(2), MaxTokens: 10, StopText: []string{"three"}, Decoder: dec})
	drive(t, s, 100)
	_, text, r := collect(t, st)
	if text != "one two " || r.Reason != ReasonStop {
		t.Errorf("text %q reason %v, want %q stop", text, r.Reason, "one two ")
	}
	// A partial match that never completes is released at the end.
	e2 := newFakeEngine(nil)
	s2, _ := newManual(t, Config{}, nil, e2)
	st = submit(t, s2, Request{Prompt: prompt(2), MaxTokens: 3, StopText: []string{"three!"}, Decoder: &textDecoder{words: []string{"one ", "two ", "thr"}}})
	drive(t, s2, 100)
	if _, text, r := collect(t, st); text != "one two thr" || r.Reason != ReasonLength {
		t.Errorf("text %q reason %v, want %q length", text, r.Reason, "one two thr")
	}
}

func TestSegmentsParkResumeAndEvict(t *testing.T) {
	e := newFakeEngine(nil)
	e.maxSeqs = 2
	s, _ := newManual(t, Config{}, nil, e)
	words := []string{"go ", "left\n", "pick ", "up\nthen ", "stop\n"}
	seg, err := NewSegmenter("line")
	if err != nil {
		t.Fatal(err)
	}
	// Room for one token past the third line: a segment that ends at
	// the limit ends the request instead (TestSegmentAtTheLimitEndsTheRequest).
	st := submit(t, s, Request{ID: "robot", Prompt: prompt(3), MaxTokens: 6, Segment: seg, Decoder: &textDecoder{words: words}})
	drive(t, s, 100)
	toks, text, r := collect(t, st)
	if text != "go left\n" || r.Reason != ReasonSegment || !r.Resumable || len(toks) != 2 {
		t.Fatalf("segment 1: %q %v resumable %v tokens %v", text, r.Reason, r.Resumable, toks)
	}
	if len(e.seqs) != 1 {
		t.Fatalf("parked sequence not kept: %d allocated", len(e.seqs))
	}
	st, err = s.Resume(context.Background(), "robot", ResumeOptions{Deadline: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, 100)
	_, text, r = collect(t, st)
	if text != "pick up\n" || r.Reason != ReasonSegment || !r.HasDeadline || !r.DeadlineMet {
		t.Fatalf("segment 2: %q %v deadline %v met %v", text, r.Reason, r.HasDeadline, r.DeadlineMet)
	}
	// Fill the engine so the parked sequence is evicted, then resume: it
	// is rebuilt by prefill and continues where it stopped.
	a := submit(t, s, Request{Prompt: prompt(3), MaxTokens: 2})
	b := submit(t, s, Request{Prompt: prompt(3), MaxTokens: 2})
	drive(t, s, 100)
	collect(t, a)
	collect(t, b)
	if s.Stats().Evicted != 1 {
		t.Fatalf("evicted %d, want 1", s.Stats().Evicted)
	}
	st, err = s.Resume(context.Background(), "robot", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, 100)
	toks, text, r = collect(t, st)
	if text != "then stop\n" || r.Reason != ReasonSegment {
		t.Errorf("segment 3: %q %v, want %q", text, r.Reason, "then stop\n")
	}
	if want := []int32{104}; !slices.Equal(toks, want) {
		t.Errorf("segment 3 tokens %v, want %v (the rebuilt sequence continues)", toks, want)
	}
	if last := e.starts[len(e.starts)-1]; last != "robot" {
		t.Errorf("last start %q, want the rebuild of robot", last)
	}
	if _, err := s.Resume(context.Background(), "nope", ResumeOptions{}); !errors.Is(err, ErrNotParked) {
		t.Errorf("resume unknown: %v", err)
	}
	if err := s.Discard("robot"); err != nil {
		t.Errorf("discard: %v", err)
	}
	drive(t, s, 10)
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences left after discard", len(e.seqs))
	}
}

func TestParkedRequestsExpire(t *testing.T) {
	e := newFakeEngine(nil)
	s, clock := newManual(t, Config{ParkTTL: time.Minute}, nil, e)
	seg, _ := NewSegmenter("line")
	st := submit(t, s, Request{ID: "p", Prompt: prompt(3), MaxTokens: 5, Segment: seg, Decoder: &textDecoder{words: []string{"a\n"}}})
	drive(t, s, 100)
	collect(t, st)
	clock.Add(2 * time.Minute)
	if _, err := s.Resume(context.Background(), "p", ResumeOptions{}); !errors.Is(err, ErrNotParked) {
		t.Errorf("resume after TTL: %v, want ErrNotParked", err)
	}
	drive(t, s, 10)
	if len(e.seqs) != 0 {
		t.Errorf("expired request still holds %d sequences", len(e.seqs))
	}
}

func TestEngineFailureEndsMembers(t *testing.T) {
	e := newFakeEngine(nil)
	s, _ := newManual(t, Config{}, nil, e)
	st := submit(t, s, Request{Prompt: prompt(3), MaxTokens: 5})
	e.failNext = true
	drive(t, s, 10)
	_, _, r := collect(t, st)
	if r.Reason != ReasonError || r.Err == nil {
		t.Errorf("reason %v err %v, want error", r.Reason, r.Err)
	}
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences left", len(e.seqs))
	}
}

func TestMultiTokenSteps(t *testing.T) {
	e := newFakeEngine(nil)
	e.perStep = 3
	e.lengths["a"] = 7
	s, _ := newManual(t, Config{}, nil, e)
	a := submit(t, s, Request{ID: "a", Prompt: prompt(2), StopTokens: []int32{fakeEOS}})
	b := submit(t, s, Request{ID: "b", Prompt: prompt(2), MaxTokens: 5})
	drive(t, s, 100)
	if toks, _, r := collect(t, a); len(toks) != 7 || r.Reason != ReasonStop {
		t.Errorf("a: %d tokens %v", len(toks), r.Reason)
	}
	if toks, _, r := collect(t, b); len(toks) != 5 || r.Reason != ReasonLength {
		t.Errorf("b: %d tokens %v, want exactly max_tokens", len(toks), r.Reason)
	}
}

func TestAutoIDsSkipCallerIDs(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	submit(t, s, Request{ID: "1", Prompt: prompt(3), MaxTokens: 3})
	st, err := s.Submit(context.Background(), Request{Prompt: prompt(3), MaxTokens: 3})
	if err != nil || st.ID() != "2" {
		t.Fatalf("submit without an id beside a caller's \"1\": %v, want id 2", err)
	}
}

func TestResumeCountsAsAdmitted(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	seg, _ := NewSegmenter("line")
	st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 10, Segment: seg, Decoder: &textDecoder{words: []string{"a\n"}}})
	drive(t, s, 100)
	collect(t, st)
	if _, err := s.Resume(context.Background(), "r", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Admitted; got != 2 {
		t.Errorf("admitted %d after a submit and a resume, want 2", got)
	}
}

func TestTinyParkTTL(t *testing.T) {
	// A TTL of a few nanoseconds still makes a janitor tick, not a panic.
	s, err := New(Config{ParkTTL: 3 * time.Nanosecond}, nil, Lane{Engine: newFakeEngine(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownDrainsThenCancels(t *testing.T) {
	e := newFakeEngine(nil)
	e.delay = time.Millisecond
	s, err := New(Config{}, nil, Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	short, _ := s.Submit(context.Background(), Request{Prompt: prompt(2), MaxTokens: 3})
	forever, _ := s.Submit(context.Background(), Request{Prompt: prompt(2), MaxTokens: 4000})
	waitFor(t, func() bool { return short.Result() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown: %v, want the drain timeout", err)
	}
	if r := forever.Result(); r == nil || r.Reason != ReasonCancelled {
		t.Errorf("long request after shutdown: %+v", r)
	}
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences left after shutdown", len(e.seqs))
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: prompt(2)}); !errors.Is(err, ErrClosed) {
		t.Errorf("submit after shutdown: %v", err)
	}
}

func TestRankingReusedForAFewSteps(t *testing.T) {
	e := newFakeEngine(nil)
	s, clock := newManual(t, Config{}, nil, e)
	l := s.lanes[0]
	now := s.cfg.Now()
	tk := &task{score: 400, promptLen: 10, arrival: now.Add(-time.Minute)}
	q := []*task{tk}
	reuse := s.ranker(l, now).reuse
	if reuse <= 0 {
		t.Fatalf("reuse window %v", reuse)
	}
	s.topK(pool{queues: [][]*task{q}, own: -1}, l, s.ranker(l, now), 1)
	p0 := tk.pri
	// Within the window the cached priority stands; after it, aging
	// raises it (the request is a minute past its implicit deadline).
	clock.Add(reuse / 2)
	s.topK(pool{queues: [][]*task{q}, own: -1}, l, s.ranker(l, s.cfg.Now()), 1)
	if tk.pri != p0 {
		t.Errorf("priority recomputed within the reuse window: %v then %v", p0, tk.pri)
	}
	clock.Add(reuse)
	s.topK(pool{queues: [][]*task{q}, own: -1}, l, s.ranker(l, s.cfg.Now()), 1)
	if !(tk.pri > p0) {
		t.Errorf("priority after the window %v, want above %v", tk.pri, p0)
	}
	// Another lane's ranker, or a change to the request (shedding cuts
	// its score), computes it afresh.
	p1 := tk.pri
	tk.rankedBy = 0
	tk.score = 10
	s.topK(pool{queues: [][]*task{q}, own: -1}, l, s.ranker(l, s.cfg.Now()), 1)
	if tk.pri == p1 {
		t.Error("a stale priority was reused")
	}
}

// busyLane makes a manual scheduler on e, at 10 ms a step per member
// (and seeded so), with n long requests of so many tokens and no
// deadline that have decoded for steps steps.
func busyLane(t *testing.T, cfg Config, e *fakeEngine, n, tokens, steps int) (*Scheduler, *fakeEngine, []*Stream) {
	t.Helper()
	e.stepA, e.stepB = 0, 10*time.Millisecond
	s, _ := newManual(t, cfg, nil, e)
	s.SeedCost(0, 0, 10*time.Millisecond, 0)
	var long []*Stream
	for i := range n {
		long = append(long, submit(t, s, Request{ID: "long" + strconv.Itoa(i), Prompt: prompt(2), MaxTokens: tokens}))
	}
	for range steps {
		stepLane(s, 0)
	}
	return s, e, long
}

func TestPreemptionMakesRoomForADeadline(t *testing.T) {
	// A step costs 10 ms per member. Four long requests without deadlines
	// fill the lane; then a request with 20 tokens and a 300 ms deadline
	// arrives. In a batch of five (or after waiting for a slot) it needs
	// a second or more; alone, 200 ms.
	run := func(ablate Ablation) (*Scheduler, *Result, []*Result) {
		s, _, long := busyLane(t, Config{MaxBatch: 4, Ablate: ablate}, newFakeEngine(nil), 4, 100, 5)
		urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 300 * time.Millisecond})
		drive(t, s, 10000)
		_, _, ru := collect(t, urgent)
		var rl []*Result
		for _, st := range long {
			_, _, r := collect(t, st)
			rl = append(rl, r)
		}
		return s, ru, rl
	}
	s, ru, rl := run(Ablation{NoShedding: true})
	if !ru.DeadlineMet {
		t.Errorf("urgent request missed its deadline (finished %v after arrival)", ru.Finish.Sub(ru.Arrival))
	}
	if s.Stats().Preempted != 4 {
		t.Errorf("%d requests preempted, want all 4 (only alone does the urgent one meet its deadline)", s.Stats().Preempted)
	}
	// The preempted requests continue where they stopped: every token
	// once, in order.
	for i, r := range rl {
		if r.CompletionTokens != 100 || r.Reason != ReasonLength {
			t.Errorf("long%d: %d tokens, %v; want all 100", i, r.CompletionTokens, r.Reason)
		}
	}
	// Without admission control (and so without preemption) it waits for
	// a slot or shares the lane, and misses.
	s2, ru2, _ := run(Ablation{NoShedding: true, NoAdmission: true})
	if ru2.DeadlineMet || s2.Stats().Preempted != 0 {
		t.Errorf("without admission control: deadline met %v, %d preempted; the scenario tests nothing", ru2.DeadlineMet, s2.Stats().Preempted)
	}
}

func TestPreemptionMakesRoomForARunningDeadline(t *testing.T) {
	// Three long requests and an urgent one (40 tokens, due in 3.5 s)
	// share a lane at 10 ms per member: 1.6 s in a batch of four, so
	// admission lets it in. Then steps get four times as costly (on a
	// real engine: the long answers' contexts grew, or the device
	// throttled). In the batch of four the urgent request would now need
	// over 6 s; alone, about 1.6 s. Only members leaving keeps its
	// deadline, and admission control alone never takes them out. (The
	// cost model takes a few steps to see the change.)
	run := func(ablate Ablation) (*Scheduler, *Result, []*Result) {
		s, e, long := busyLane(t, Config{MaxBatch: 4, Ablate: ablate}, newFakeEngine(nil), 3, 200, 3)
		urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(4), MaxTokens: 40, Deadline: 3500 * time.Millisecond})
		stepLane(s, 0)
		stepLane(s, 0)
		if got := len(e.batches[len(e.batches)-1]); got != 4 {
			t.Fatalf("the urgent request runs in a batch of %d, want 4: the scenario needs it admitted beside the long ones", got)
		}
		e.stepB = 25 * time.Millisecond
		drive(t, s, 10000)
		_, _, ru := collect(t, urgent)
		var rl []*Result
		for _, st := range long {
			toks, _, r := collect(t, st)
			for k, tok := range toks {
				if tok != int32(100+k) {
					t.Fatalf("%s: token %d is %d, want %d: a preempted request lost or repeated tokens", r.ID, k, tok, 100+k)
				}
			}
			rl = append(rl, r)
		}
		return s, ru, rl
	}
	s, ru, rl := run(Ablation{NoShedding: true})
	if !ru.DeadlineMet {
		t.Errorf("urgent request missed its deadline (finished %v after arrival, %d preempted)", ru.Finish.Sub(ru.Arrival), s.Stats().Preempted)
	}
	if s.Stats().Preempted == 0 {
		t.Error("nothing preempted")
	}
	for _, r := range rl {
		if r.CompletionTokens != 200 || r.Reason != ReasonLength {
			t.Errorf("%s: %d tokens, %v; want all 200", r.ID, r.CompletionTokens, r.Reason)
		}
	}
	// Without admission control (and so without preemption) it keeps its
	// batch, and misses.
	s2, ru2, _ := run(Ablation{NoShedding: true, NoAdmission: true})
	if ru2.DeadlineMet || s2.Stats().Preempted != 0 {
		t.Errorf("without admission control: deadline met %v, %d preempted; the scenario tests nothing", ru2.DeadlineMet, s2.Stats().Preempted)
	}
}

func TestPreemptionMakesRoomUnderTheBatchCap(t *testing.T) {
	// Six long requests fill a lane at 10 ms per member. An urgent one
	// arrives: 20 tokens due in 1.2 s, 60 ms a token. In a batch of five
	// it would finish in time, but the batch cap it sets is four (a step
	// may take three quarters of 60 ms). Preemption sized for a batch of
	// five moved two members out, which left the four the cap allows and
	// no slot for the request: it waited 230 ms (five steps) until its
	// shrinking slack forced one more out. With stories260K's costs in
	// the simulator, such waits were most of the planners' missed
	// deadlines (docs/scheduling.md, "Preemption under the batch cap").
	s, e, long := busyLane(t, Config{MaxBatch: 8, Ablate: Ablation{NoShedding: true}}, newFakeEngine(nil), 6, 200, 3)
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 1200 * time.Millisecond})
	if got := s.batchCap(s.lanes[0], e.clock.Now()); got != 4 {
		t.Fatalf("batch cap %d, want 4: the scenario needs the urgent request's cap below the batch it would meet its deadline in", got)
	}
	drive(t, s, 10000)
	_, _, ru := collect(t, urgent)
	if wait := ru.FirstToken.Sub(ru.Arrival); wait > 100*time.Millisecond {
		t.Errorf("urgent request waited %v for its first token, want one step (about 40 ms): nothing made room for it", wait)
	}
	if !ru.DeadlineMet {
		t.Errorf("urgent request missed its deadline (finished %v after arrival, %d preempted)", ru.Finish.Sub(ru.Arrival), s.Stats().Preempted)
	}
	for _, st := range long {
		toks, _, r := collect(t, st)
		if len(toks) != 200 || toks[0] != 100 || toks[199] != 299 {
			t.Errorf("%s: %d tokens; a preempted request lost or repeated tokens", r.ID, len(toks))
		}
	}
}

func TestPreemptedSequencesAreEvictedWhenSlotsRunOut(t *testing.T) {
	// Five sequence slots, batches of four: four long requests run, an
	// urgent one preempts them all (five slots held), and a second
	// urgent one needs a slot while the first runs: a preempted request
	// gives its sequence up and is rebuilt by prefill later, its tokens
	// unchanged. (The first is due in 13 ms a token, below what batchCap
	// plans for, and the second in 80 ms a token, loose enough: batchCap
	// keeps batches of four. A deadline between would keep the batch too
	// small to need the slot.)
	e := newFakeEngine(nil)
	e.maxSeqs = 5
	s, _, long := busyLane(t, Config{MaxBatch: 4, Ablate: Ablation{NoShedding: true}}, e, 4, 60, 5)
	u1 := submit(t, s, Request{ID: "u1", Prompt: prompt(10), MaxTokens: 10, Deadline: 130 * time.Millisecond})
	stepLane(s, 0)
	stepLane(s, 0)
	u2 := submit(t, s, Request{ID: "u2", Prompt: prompt(10), MaxTokens: 10, Deadline: 800 * time.Millisecond})
	drive(t, s, 10000)
	for _, st := range []*Stream{u1, u2} {
		if _, _, r := collect(t, st); !r.DeadlineMet {
			t.Errorf("%s missed its deadline (finished %v after arrival)", r.ID, r.Finish.Sub(r.Arrival))
		}
	}
	for i, st := range long {
		toks, _, r := collect(t, st)
		for k, tok := range toks {
			if tok != int32(100+k) {
				t.Fatalf("long%d: token %d is %d, want %d: a preempted request lost or repeated tokens", i, k, tok, 100+k)
			}
		}
		if len(toks) != 60 || r.Reason != ReasonLength {
			t.Errorf("long%d: %d tokens, %v; want 60", i, len(toks), r.Reason)
		}
	}
	if st := s.Stats(); st.Preempted == 0 || st.Evicted == 0 {
		t.Errorf("preempted %d, evicted %d: the scenario did not need a preempted sequence's slot", st.Preempted, st.Evicted)
	}
}

// The tasks with deadlines are kept earliest first, so preempt and
// missing stop at the first that fits; a task leaves when it ends, when
// it parks, and when its deadline passes, and a resumed one comes back
// in its new place.
func TestDeadlineListStaysInDeadlineOrder(t *testing.T) {
	s, clock := newManual(t, Config{Policy: Tandem}, nil, newFakeEngine(nil))
	order := func() []string {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		var ids []string
		for i, x := range s.withDeadline {
			if i > 0 && x.deadline.Before(s.withDeadline[i-1].deadline) {
				t.Fatalf("withDeadline out of order at %d", i)
			}
			if !x.inDeadline {
				t.Fatalf("%s listed but not marked", x.id)
			}
			ids = append(ids, x.id)
		}
		return ids
	}
	for _, r := range []struct {
		id string
		dl time.Duration
	}{{"c", 30 * time.Second}, {"a", 10 * time.Second}, {"none", 0}, {"b", 20 * time.Second}, {"a2", 10 * time.Second}} {
		submit(t, s, Request{ID: r.id, Prompt: prompt(4), MaxTokens: 8, Deadline: r.dl})
	}
	if got := order(); !slices.Equal(got, []string{"a", "a2", "b", "c"}) { // ties keep arrival order
		t.Fatalf("order %v", got)
	}

	// A cancelled request leaves at once, not when a scan meets it.
	ctx, cancel := context.WithCancel(context.Background())
	st, err := s.Submit(ctx, Request{ID: "gone", Prompt: prompt(4), MaxTokens: 8, Deadline: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := order(); !slices.Equal(got, []string{"a", "a2", "gone", "b", "c"}) {
		t.Fatalf("order %v", got)
	}
	cancel()
	if _, err := st.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := order(); !slices.Equal(got, []string{"a", "a2", "b", "c"}) {
		t.Fatalf("after cancel: %v", got)
	}

	// Past 15 s, a and a2 are due: the next look drops them.
	clock.Add(15 * time.Second)
	s.mu.Lock()
	s.deadlined(clock.Now())
	s.mu.Unlock()
	if got := order(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("after 15 s: %v", got)
	}
	drive(t, s, 1000)
	if got := order(); len(got) != 0 {
		t.Fatalf("finished requests still listed: %v", got)
	}

	// A parked segment leaves; resumed with a nearer deadline it comes
	// back ahead of one due later.
	seg, err := NewSegmenter("line")
	if err != nil {
		t.Fatal(err)
	}
	submit(t, s, Request{ID: "robot", Prompt: prompt(3), MaxTokens: 5, Deadline: time.Minute, Segment: seg,
		Decoder: &textDecoder{words: []string{"go ", "left\n", "stop\n"}}})
	drive(t, s, 100)
	if got := order(); len(got) != 0 {
		t.Fatalf("parked request still listed: %v", got)
	}
	submit(t, s, Request{ID: "later", Prompt: prompt(4), MaxTokens: 8, Deadline: 50 * time.Second})
	if _, err := s.Resume(context.Background(), "robot", ResumeOptions{Deadline: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := order(); !slices.Equal(got, []string{"robot", "later"}) {
		t.Fatalf("after resume: %v", got)
	}
}

// TestOptionalListHoldsOnlyWhatCanBeShed checks the list shedding reads:
// a request leaves it when it ends, and a shed request at once even when
// it runs on to its mandatory tokens, since shedding skips its per-step
// checks only when the list is empty.
func TestOptionalListHoldsOnlyWhatCanBeShed(t *testing.T) {
	e := newFakeEngine(nil)
	e.stepA, e.stepB = 0, 10*time.Millisecond
	s, _ := newManual(t, Config{MaxBatch: 2}, nil, e)
	s.SeedCost(0, 0, 10*time.Millisecond, 0)

	// No overload: a summary runs to its end and leaves the list.
	done := submit(t, s, Request{ID: "quiet", Prompt: prompt(2), MinTokens: 2, MaxTokens: 6})
	if n := len(s.withOptional); n != 1 {
		t.Fatalf("%d requests listed with optional tokens, want 1", n)
	}
	drive(t, s, 100)
	collect(t, done)
	if n := len(s.withOptional); n != 0 {
		t.Errorf("%d requests still listed after the summary ended", n)
	}

	// A summary shed before its mandatory tokens keeps running, with
	// nothing left to shed: it must leave the list then.
	bg := submit(t, s, Request{ID: "bg", Prompt: prompt(2), MinTokens: 30, MaxTokens: 100, Utility: Utility{Value: 0.1}})
	st := s.Begin(0)
	st.Run(context.Background())
	s.End(st)
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(20), MaxTokens: 20, Deadline: 250 * time.Millisecond})
	for i := 0; s.Stats().ShedRequests == 0; i++ {
		if i == 100 {
			t.Fatal("nothing was shed")
		}
		st := s.Begin(0)
		st.Run(context.Background())
		s.End(st)
	}
	s.mu.Lock()
	task := s.tasks["bg"]
	running := task != nil && task.state == running
	listed := slices.Contains(s.withOptional, task)
	s.mu.Unlock()
	if !running || listed {
		t.Errorf("shed summary: running %v, still listed %v; want running and not listed", running, listed)
	}
	drive(t, s, 1000)
	collect(t, bg)
	collect(t, urgent)
	if n := len(s.withOptional); n != 0 {
		t.Errorf("%d requests listed after every request ended", n)
	}
}

// TestStatsSumTheLanes checks that Stats totals what each lane counts on
// its own: the tokens it generated, its engine time, and the time of its
// planning and delivery in the scheduler's, which the lane reports apart
// from the intake's.
func TestStatsSumTheLanes(t *testing.T) {
	e0, e1 := newFakeEngine(nil), newFakeEngine(nil)
	e0.delay, e1.delay = 200*time.Microsecond, 200*time.Microsecond
	s, _ := newManual(t, Config{Policy: FIFO, MaxBatch: 2}, nil, e0, e1)
	var streams []*Stream
	for i := range 6 {
		before := s.Stats()
		st, err := s.Submit(context.Background(), Request{Prompt: prompt(4), MaxTokens: 5})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
		// Submitting is the intake's time, not a lane's.
		after := s.Stats()
		if d := after.SchedulerWall - before.SchedulerWall; d <= 0 || after.IntakeWall-before.IntakeWall != d {
			t.Errorf("submit %d: scheduler time %v → %v, intake's %v → %v; want both to grow alike",
				i, before.SchedulerWall, after.SchedulerWall, before.IntakeWall, after.IntakeWall)
		}
		for j := range after.Lanes {
			if after.Lanes[j].SchedulerWall != before.Lanes[j].SchedulerWall {
				t.Errorf("submit %d: lane %d's scheduler time %v → %v", i, j, before.Lanes[j].SchedulerWall, after.Lanes[j].SchedulerWall)
			}
		}
	}
	// Each lane's own step adds to the scheduler's time, as that lane's.
	for i := range s.lanes {
		before := s.Stats()
		stepLane(s, i)
		after := s.Stats()
		if after.SchedulerWall <= before.SchedulerWall {
			t.Errorf("a step of lane %d left the scheduler's time at %v (was %v)", i, after.SchedulerWall, before.SchedulerWall)
		}
		for j := range after.Lanes {
			if grew := after.Lanes[j].SchedulerWall > before.Lanes[j].SchedulerWall; grew != (j == i) {
				t.Errorf("a step of lane %d: lane %d's scheduler time %v → %v", i, j, before.Lanes[j].SchedulerWall, after.Lanes[j].SchedulerWall)
			}
		}
		if d, dl := after.SchedulerWall-before.SchedulerWall, after.Lanes[i].SchedulerWall-before.Lanes[i].SchedulerWall; d != dl || after.IntakeWall != before.IntakeWall {
			t.Errorf("a step of lane %d added %v to the scheduler's time, %v to the lane's and %v to the intake's", i, d, dl, after.IntakeWall-before.IntakeWall)
		}
	}
	drive(t, s, 1000)
	var want uint64
	for _, st := range streams {
		_, _, res := collect(t, st)
		want += uint64(res.CompletionTokens)
	}
	st := s.Stats()
	if st.Tokens != want || want != 30 {
		t.Errorf("Stats counts %d tokens, the streams got %d (want 30)", st.Tokens, want)
	}
	var engine time.Duration
	for i, l := range st.Lanes {
		if l.Steps == 0 || l.EngineWall < time.Duration(l.Steps)*e0.delay {
			t.Errorf("lane %d: %d steps, engine time %v", i, l.Steps, l.EngineWall)
		}
		engine += l.EngineWall
	}
	if st.EngineWall != engine {
		t.Errorf("Stats gives %v of engine time, its lanes %v", st.EngineWall, engine)
	}
	sum := st.IntakeWall
	for _, l := range st.Lanes {
		sum += l.SchedulerWall
	}
	if st.SchedulerWall != sum {
		t.Errorf("Stats gives %v of scheduler time, the intake and the lanes %v", st.SchedulerWall, sum)
	}
}

// TestTokensCountWhatWasDelivered: an engine that gives several tokens a
// step (a speculative one) may give some past a stop; Stats counts only
// the tokens the requests kept.
func TestTokensCountWhatWasDelivered(t *testing.T) {
	e := newFakeEngine(nil)
	e.lengths["eos"] = 5
	e.perStep = 4
	s, _ := newManual(t, Config{}, nil, e)
	dec := &textDecoder{words: []string{"a ", "b ", "stop ", "c "}}
	eos := submit(t, s, Request{ID: "eos", Prompt: prompt(3), MaxTokens: 50, StopTokens: []int32{fakeEOS}})
	text := submit(t, s, Request{ID: "text", Prompt: prompt(3), MaxTokens: 50, StopText: []string{"stop"}, Decoder: dec})
	drive(t, s, 100)
	var want, attended uint64
	for _, st := range []*Stream{eos, text} {
		_, _, res := collect(t, st)
		if res.Reason != ReasonStop {
			t.Fatalf("%s ended %v, want stop", res.ID, res.Reason)
		}
		want += uint64(res.CompletionTokens)
		// The j-th kept token followed the prompt and j earlier ones.
		for j := range res.CompletionTokens {
			attended += uint64(res.PromptTokens + j)
		}
	}
	st := s.Stats()
	if st.Tokens != want {
		t.Errorf("Stats counts %d tokens, the requests kept %d", st.Tokens, want)
	}
	if st.Attended != attended || attended == 0 {
		t.Errorf("Stats counts %d attended context tokens, the kept tokens followed %d", st.Attended, attended)
	}
}

func TestLateDeadlineGoesFirstWhileItsUtilityLasts(t *testing.T) {
	// One slot, 10 ms a token. A long request runs; an old request
	// without a deadline waits, long overdue; then a planner arrives due
	// in 20 ms with 5 tokens, which it can no longer meet. (Phi puts the
	// old request's implicit deadline 2 ms after its arrival, so it is
	// the more overdue.) When the slot frees, the planner still earns
	// utility if its value lasts long enough after the deadline (Slope),
	// and goes first; once its value is spent it ages like the rest and
	// the older request goes first.
	run := func(u Utility) (planner, old *Result) {
		cfg := Config{MaxBatch: 1, Phi: time.Millisecond, Ablate: Ablation{NoShedding: true}}
		s, _, long := busyLane(t, cfg, newFakeEngine(nil), 1, 30, 1)
		o := submit(t, s, Request{ID: "old", Prompt: prompt(2), MaxTokens: 5})
		for range 10 {
			stepLane(s, 0)
		}
		p := submit(t, s, Request{ID: "planner", Prompt: prompt(2), MaxTokens: 5, Deadline: 20 * time.Millisecond, Utility: u})
		drive(t, s, 1000)
		collect(t, long[0])
		_, _, planner = collect(t, p)
		_, _, old = collect(t, o)
		if planner.DeadlineMet {
			t.Fatalf("the planner met its deadline (finished %v after arrival): the scenario needs it missed", planner.Finish.Sub(planner.Arrival))
		}
		return planner, old
	}
	p, o := run(Utility{Value: 1, Slope: 1}) // worth something for a second after its deadline
	if !p.FirstToken.Before(o.FirstToken) {
		t.Errorf("late planner with utility left started at %v, the old request at %v: want the planner first", p.FirstToken.Sub(p.Arrival), o.FirstToken.Sub(p.Arrival))
	}
	if p.Utility <= 0 {
		t.Errorf("late planner earned utility %v, want some", p.Utility)
	}
	p, o = run(Utility{}) // the default: nothing left 20 ms after the deadline
	if !o.FirstToken.Before(p.FirstToken) {
		t.Errorf("planner with no utility left started at %v, the old request at %v: want the older request first", p.FirstToken.Sub(p.Arrival), o.FirstToken.Sub(p.Arrival))
	}
}

// reusingEngine is a fakeEngine whose sequences find their context's
// first `reusable` tokens already evaluated (prefix reuse), so it
// prefills only the rest, as ModelEngine does with a kept sequence.
type reusingEngine struct {
	*fakeEngine
	reusable int
	asked    int // Reusable calls
}

func (e *reusingEngine) Reusable(prompt, generated []int32) int {
	e.asked++
	return min(e.reusable, len(prompt)+len(generated)-1)
}

func (e *reusingEngine) ReusedTokens() int64 { return 0 }

func (e *reusingEngine) Start(tokens []int32, s *sample.Sampler, tag string) (SeqID, error) {
	id, err := e.fakeEngine.Start(tokens, s, tag)
	if err == nil {
		e.seqs[id].pending -= e.Reusable(tokens, nil)
	}
	return id, err
}

// TestAdmissionPricesReusedPrefix: admission control prices a joining
// request's prefill at what the lane will evaluate. A next turn of 61
// tokens whose first 60 the lane holds joins beside a running deadline at
// once; prefilled whole (120 ms) it would make that deadline miss, and
// waits.
func TestAdmissionPricesReusedPrefix(t *testing.T) {
	for _, reusable := range []int{60, 0} {
		clock := newClock()
		e := &reusingEngine{fakeEngine: newFakeEngine(clock), reusable: reusable}
		e.stepA, e.stepB, e.stepC = 0, time.Millisecond, 2*time.Millisecond
		s, err := New(Config{Manual: true, Now: clock.Now, MaxBatch: 4}, nil, Lane{Engine: e})
		if err != nil {
			t.Fatal(err)
		}
		s.SeedCost(0, 0, time.Millisecond, 2*time.Millisecond)
		// 40 tokens at 1 ms per member-step: 40 ms alone, 80 ms with a
		// second member, within the 100 ms deadline; with 120 ms of the
		// next turn's prefill too, past it.
		urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(2), MaxTokens: 40, Deadline: 100 * time.Millisecond})
		st := s.Begin(0)
		st.Run(context.Background())
		s.End(st)
		turn := submit(t, s, Request{ID: "turn", Prompt: prompt(61), MaxTokens: 5})
		submitted := clock.Now()
		drive(t, s, 1000)
		_, _, ru := collect(t, urgent)
		_, _, rt := collect(t, turn)
		if !ru.DeadlineMet {
			t.Errorf("reusable %d: the urgent request finished %v after arrival, past its deadline", reusable, ru.Finish.Sub(ru.Arrival))
		}
		joined := rt.FirstToken.Sub(submitted)
		if reusable > 0 && (joined > 10*time.Millisecond || s.Stats().Deferred != 0) {
			t.Errorf("reusable %d: the next turn's first token came %v after it was sent, %d admissions deferred; want it admitted at once", reusable, joined, s.Stats().Deferred)
		}
		if reusable == 0 && (joined < 30*time.Millisecond || s.Stats().Deferred == 0) {
			t.Errorf("reusable 0: the next turn joined after %v with %d admissions deferred; want it held back", joined, s.Stats().Deferred)
		}
		s.Shutdown(context.Background())
	}
}

// affinityOf is the lane a submitted request was routed to and whether
// for the context a lane keeps.
func affinityOf(s *Scheduler, id string) (lane int, affine bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[id]
	return t.lane, t.affine
}

// TestRouteFollowsKeptContext: a request goes to the lane that keeps most
// of its context (a conversation's next turn), whatever its score, once
// that is at least affinityMin tokens and half the context; a request
// with a deadline never goes to a much slower lane that way.
func TestRouteFollowsKeptContext(t *testing.T) {
	clock := newClock()
	engines := []*reusingEngine{{fakeEngine: newFakeEngine(clock)}, {fakeEngine: newFakeEngine(clock)}}
	s, err := New(Config{Manual: true, Now: clock.Now}, nil, Lane{Engine: engines[0]}, Lane{Engine: engines[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		drive(t, s, 10000) // every request routed is served
		s.Shutdown(context.Background())
	}()
	for i := range 20 { // short requests set the τ quantile's scale
		submit(t, s, Request{ID: fmt.Sprint("short", i), Prompt: prompt(4), MaxTokens: 4})
	}
	for _, c := range []struct {
		id       string
		n        int    // prompt tokens (the uncalibrated score)
		kept     [2]int // what each lane keeps of it
		deadline time.Duration
		lane     int
		affine   bool
	}{
		{"lane 0 keeps under affinityMin", 20, [2]int{19, 0}, 0, 1, false}, // the τ quantile's lane
		{"long, nothing kept", 200, [2]int{0, 0}, 0, 1, false},             // the τ quantile's lane
		{"long, lane 0 keeps most", 200, [2]int{150, 40}, 0, 0, true},
		{"long, lane 0 keeps under half", 200, [2]int{90, 0}, 0, 1, false},
		{"short, lane 1 keeps it", 60, [2]int{0, 59}, 0, 1, true},
	} {
		engines[0].reusable, engines[1].reusable = c.kept[0], c.kept[1]
		asked := engines[0].asked
		submit(t, s, Request{ID: c.id, Prompt: prompt(c.n), MaxTokens: 300, Deadline: c.deadline})
		lane, affine := affinityOf(s, c.id)
		if lane != c.lane || affine != c.affine {
			t.Errorf("%s: lane %d (affine %v), want %d (%v)", c.id, lane, affine, c.lane, c.affine)
		}
		// A context shorter than affinityMin cannot follow kept rows:
		// routing does not ask the engines.
		if short := c.n < affinityMin; (engines[0].asked == asked) != short {
			t.Errorf("%s: %d context tokens, engines asked %d times, want asked only from %d tokens", c.id, c.n, engines[0].asked-asked, affinityMin)
		}
	}
	if got := s.Stats().Affine; got != 2 {
		t.Errorf("Stats.Affine %d, want 2", got)
	}

	// Lane 1 ten times slower: it keeps a request's context, which goes
	// there without a deadline, and stays on the fast lane with one.
	s.SeedCost(0, time.Millisecond, time.Millisecond, 0)
	s.SeedCost(1, 10*time.Millisecond, 10*time.Millisecond, 0)
	engines[0].reusable, engines[1].reusable = 0, 90
	for _, dl := range []time.Duration{0, time.Second} {
		id := fmt.Sprint("slow lane keeps it, deadline ", dl)
		submit(t, s, Request{ID: id, Prompt: prompt(100), MaxTokens: 4, Deadline: dl})
		if lane, affine := affinityOf(s, id); (dl == 0) != (lane == 1 && affine) || dl > 0 && lane != 0 {
			t.Errorf("%s: lane %d (affine %v)", id, lane, affine)
		}
	}
}

// TestAffineRequestWakesItsLane: live lanes, the second keeping most of a
// request's context: only that lane is woken, and it serves the request
// (the first, idle, would have prefilled it all).
func TestAffineRequestWakesItsLane(t *testing.T) {
	engines := []*reusingEngine{{fakeEngine: newFakeEngine(nil)}, {fakeEngine: newFakeEngine(nil), reusable: 90}}
	s, err := New(Config{}, nil, Lane{Engine: engines[0]}, Lane{Engine: engines[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	for range 5 {
		st, err := s.Submit(context.Background(), Request{Prompt: prompt(100), MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Lane != 1 {
			t.Errorf("served on lane %d, want lane 1, which keeps its context", res.Lane)
		}
	}
}

// TestAffineRequestWaitsForItsLane: another lane leaves a request routed
// to the lane keeping its context (affinity) to that lane while it has
// room in its batch, until affinityWait has passed (its steps are not
// measured yet); and takes it at once when that lane's batch is full.
func TestAffineRequestWaitsForItsLane(t *testing.T) {
	clock := newClock()
	engines := []*reusingEngine{{fakeEngine: newFakeEngine(clock)}, {fakeEngine: newFakeEngine(clock), reusable: 90}}
	s, err := New(Config{Manual: true, Now: clock.Now, MaxBatch: 1}, nil, Lane{Engine: engines[0]}, Lane{Engine: engines[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		drive(t, s, 1000)
		s.Shutdown(context.Background())
	}()
	submit(t, s, Request{ID: "next turn", Prompt: prompt(100), MaxTokens: 4})
	if lane, affine := affinityOf(s, "next turn"); lane != 1 || !affine {
		t.Fatalf("routed to lane %d (affine %v), want lane 1", lane, affine)
	}
	if got := stepIDs(s.Begin(0)); got != nil {
		t.Fatalf("lane 0 took %v at once; lane 1 keeps its context and has room", got)
	}
	clock.Add(affinityWait)
	st := s.Begin(0)
	if got := stepIDs(st); !slices.Equal(got, []string{"next turn"}) {
		t.Fatalf("after %v lane 0 steps %v, want the request", affinityWait, got)
	}
	for ; st != nil; st = s.Begin(0) { // to its end
		st.Run(context.Background())
		s.End(st)
	}

	// Lane 1's one batch slot taken: its next affine request goes to
	// lane 0 at once.
	submit(t, s, Request{ID: "busy", Prompt: prompt(100), MaxTokens: 50})
	stepLane(s, 1)
	submit(t, s, Request{ID: "second turn", Prompt: prompt(100), MaxTokens: 4})
	if got := stepIDs(s.Begin(0)); !slices.Contains(got, "second turn") {
		t.Fatalf("with lane 1's batch full lane 0 steps %v, want the request", got)
	}
}

// TestAffineRequestPassedOverIsTaken: a request routed to the lane that
// keeps its context, which passes it over (here a much slower primary,
// past its share of the work), is taken by another lane once the
// affinity hold ends: that lane, asleep since it left the request,
// is woken for it. Sequential clients with shared instructions on two
// CPU lanes waited for good before (found with tandem serve under the
// race detector).
func TestAffineRequestPassedOverIsTaken(t *testing.T) {
	slow := &reusingEngine{fakeEngine: newFakeEngine(nil), reusable: 90}
	slow.delay = 3 * time.Millisecond
	fast := &reusingEngine{fakeEngine: newFakeEngine(nil)}
	s, err := New(Config{}, nil, Lane{Engine: slow}, Lane{Engine: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // cancels a stuck request
		defer cancel()
		s.Shutdown(ctx)
	}()
	// Both lanes' costs known, the primary's many times the other's: it
	// takes a request only where that beats waiting for the fast lane,
	// which is idle here.
	s.SeedCost(0, 3*time.Millisecond, time.Millisecond, 10*time.Microsecond)
	s.SeedCost(1, 50*time.Microsecond, 20*time.Microsecond, time.Microsecond)
	affine := 0
	for i := range 30 {
		st, err := s.Submit(context.Background(), Request{Prompt: prompt(100), MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		// A hang detector, not a speed check: a request takes
		// milliseconds here.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := st.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v; stalled for %v with %d waiting", i, err, s.Stats().Stalled, s.Stats().Waiting)
		}
		if res.Lane == 1 {
			affine++ // taken by the lane that does not keep its context
		}
	}
	if st := s.Stats(); st.Affine == 0 || affine == 0 {
		t.Errorf("%d requests routed by affinity, %d served by the other lane; want both, or the test shows nothing", st.Affine, affine)
	}
}

// TestTrimMemoryManual: a Manual scheduler's lane trims at its next
// Begin, and TrimMemory returns once it has (an engine that keeps
// nothing releases nothing).
func TestTrimMemoryManual(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	defer s.Shutdown(context.Background())
	done := make(chan error, 1)
	go func() {
		n, err := s.TrimMemory(context.Background())
		if err == nil && n != 0 {
			err = fmt.Errorf("%d bytes released", n)
		}
		done <- err
	}()
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.lanes[0].trims) == 1
	})
	st := s.Begin(0)
	if st == nil {
		t.Fatal("Begin: no step for a pending trim")
	}
	st.Run(context.Background())
	s.End(st)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.Begin(0); st != nil {
		t.Errorf("Begin after the trim: a step of %v", stepIDs(st))
	}
}
