package sched

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// segments collects a segmented request's segments, resuming it after
// each until it ends: every token and each segment's text and result.
func segments(t *testing.T, s *Scheduler, id string, st *Stream, max int) (toks []int32, texts []string, last *Result) {
	t.Helper()
	for range max {
		drive(t, s, 1000)
		tk, text, r := collect(t, st)
		toks, texts, last = append(toks, tk...), append(texts, text), r
		if r.Reason != ReasonSegment {
			return toks, texts, r
		}
		var err error
		if st, err = s.Resume(context.Background(), id, ResumeOptions{}); err != nil {
			t.Fatalf("resume after %q: %v", texts, err)
		}
	}
	return toks, texts, last
}

// inOrder checks toks are 100, 101, ...: what the fake engine emits.
func inOrder(t *testing.T, toks []int32, texts []string) {
	t.Helper()
	for i, tok := range toks {
		if tok != int32(100+i) {
			t.Fatalf("tokens %v: token %d is %d, want %d (lost or repeated); segments %q", toks, i, tok, 100+i, texts)
		}
	}
}

func TestSegmentTextPastTheCutCompletesTheNextByItself(t *testing.T) {
	// One token holds two lines, and a step makes three tokens: the second
	// line is a segment of its own, and the tokens after it wait for the
	// resume after that.
	e := newFakeEngine(nil)
	e.perStep = 3
	s, _ := newManual(t, Config{}, nil, e)
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"x\ny\n", "b ", "c ", "d\n", "e ", "f\n"}}
	st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 12, Segment: seg, Decoder: dec})
	toks, texts, last := segments(t, s, "r", st, 20)
	inOrder(t, toks, texts)
	if len(toks) != 12 || last.Reason != ReasonLength {
		t.Errorf("%d tokens, ended %v; want 12, length", len(toks), last.Reason)
	}
	if len(texts) < 3 || texts[0] != "x\n" || texts[1] != "y\n" || texts[2] != "b c d\n" {
		t.Errorf("segments %q, want \"x\\n\", \"y\\n\", \"b c d\\n\", ...", texts)
	}
}

func TestSegmentAtTheLimitEndsTheRequest(t *testing.T) {
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a ", "b\n"}}
	t.Run("max_tokens", func(t *testing.T) {
		s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
		st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 4, Segment: seg, Decoder: dec})
		toks, texts, last := segments(t, s, "r", st, 5)
		if len(toks) != 4 || last.Reason != ReasonLength || last.Resumable || len(texts) != 2 {
			t.Errorf("segments %q, %d tokens, ended %v (resumable %v); want two lines, 4 tokens, length", texts, len(toks), last.Reason, last.Resumable)
		}
	})
	t.Run("context", func(t *testing.T) {
		e := newFakeEngine(nil)
		e.ctx = 8
		s, _ := newManual(t, Config{}, nil, e)
		st := submit(t, s, Request{ID: "r", Prompt: prompt(6), Segment: seg, Decoder: dec})
		toks, _, last := segments(t, s, "r", st, 5)
		if len(toks) != 2 || last.Reason != ReasonLength || last.Resumable {
			t.Errorf("%d tokens, ended %v (resumable %v); want the 2 the context holds, length", len(toks), last.Reason, last.Resumable)
		}
	})
}

func TestStopRightAfterASegmentEndsTheRequest(t *testing.T) {
	t.Run("stop text", func(t *testing.T) {
		s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
		seg, _ := NewSegmenter("statement")
		dec := &textDecoder{words: []string{"Hi.", " STOP", " more", " text."}}
		st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 20, Segment: seg, StopText: []string{"STOP"}, Decoder: dec})
		_, texts, last := segments(t, s, "r", st, 5)
		if got := concat(texts); last.Reason != ReasonStop || got != "Hi. " {
			t.Errorf("segments %q ended %v; want \"Hi. \" (all before the stop string) and a stop", texts, last.Reason)
		}
	})
	t.Run("stop token after held text", func(t *testing.T) {
		// Chat's stop string holds back a trailing newline, so the line
		// completes only when EOS flushes it.
		e := newFakeEngine(nil)
		e.lengths["r"] = 2
		s, _ := newManual(t, Config{}, nil, e)
		seg, _ := NewSegmenter("line")
		dec := &textDecoder{words: []string{"a ", "b\n", "c ", "d\n"}}
		st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 20, Segment: seg, StopTokens: []int32{fakeEOS},
			StopText: []string{"\nUser:"}, Decoder: dec})
		_, texts, last := segments(t, s, "r", st, 5)
		if last.Reason != ReasonStop || last.Resumable || concat(texts) != "a b\n" {
			t.Errorf("segments %q ended %v (resumable %v); want \"a b\\n\" and a stop", texts, last.Reason, last.Resumable)
		}
	})
}

func concat(texts []string) string {
	var out string
	for _, x := range texts {
		out += x
	}
	return out
}

func TestResumeWithHugeMaxTokens(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a\n", "b ", "c ", "d ", "e\n"}}
	st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 100, Segment: seg, Decoder: dec})
	drive(t, s, 100)
	collect(t, st)
	st, err := s.Resume(context.Background(), "r", ResumeOptions{MaxTokens: math.MaxInt})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, 100)
	if _, text, r := collect(t, st); r.Reason != ReasonSegment || text != "b c d e\n" {
		t.Errorf("resumed with MaxTokens = MaxInt: %q, %v; want the next line", text, r.Reason)
	}
}

func TestShedWaitingRequestAtItsCutEnds(t *testing.T) {
	// A resumed request past its mandatory part waits behind a long one
	// when an urgent request makes the lane shed: cut to the tokens it
	// has, it ends there without generating another.
	s, _ := newManual(t, Config{MaxBatch: 1}, nil, newFakeEngine(nil))
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a ", "b\n", "c ", "d ", "e\n"}}
	st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MinTokens: 1, MaxTokens: 50, Segment: seg, Decoder: dec})
	drive(t, s, 100)
	if _, _, r := collect(t, st); r.TotalGenerated != 2 {
		t.Fatalf("first segment generated %d tokens, want 2", r.TotalGenerated)
	}
	long := submit(t, s, Request{ID: "long", Prompt: prompt(3), MaxTokens: 30})
	stepLane(s, 0)
	st, err := s.Resume(context.Background(), "r", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(3), MaxTokens: 5, Deadline: time.Millisecond})
	drive(t, s, 200)
	toks, _, r := collect(t, st)
	if r.Reason != ReasonShed || len(toks) != 0 || r.TotalGenerated != 2 {
		t.Errorf("resumed request ended %v with %d more tokens (%d in all); want shed with none more", r.Reason, len(toks), r.TotalGenerated)
	}
	collect(t, long)
	collect(t, urgent)
}

func TestShutdownDropsARequestThatParksWhileDraining(t *testing.T) {
	e := newFakeEngine(nil)
	e.delay = 2 * time.Millisecond
	s, err := New(Config{}, nil, Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a ", "b ", "c ", "d ", "e\n", "f ", "g\n"}}
	st, err := s.Submit(context.Background(), Request{ID: "r", Prompt: prompt(3), MaxTokens: 50, Segment: seg, Decoder: dec})
	if err != nil {
		t.Fatal(err)
	}
	// Shutdown starts while the first line is still being generated.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v, want a clean drain", err)
	}
	if r := st.Result(); r == nil || r.Reason != ReasonSegment {
		t.Errorf("request after shutdown: %+v, want its first segment", r)
	}
	if len(e.seqs) != 0 {
		t.Errorf("%d sequences left after shutdown", len(e.seqs))
	}
}

func TestDiscardOfARunningRequestIsBusy(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MaxTokens: 5})
	stepLane(s, 0)
	if err := s.Discard("r"); !errors.Is(err, ErrBusy) {
		t.Errorf("discard while generating: %v, want ErrBusy", err)
	}
	drive(t, s, 100)
	collect(t, st)
	if err := s.Discard("r"); !errors.Is(err, ErrNotParked) {
		t.Errorf("discard after the end: %v, want ErrNotParked", err)
	}
}

func TestMaxParkedDropsTheOldest(t *testing.T) {
	e := newFakeEngine(nil)
	s, clock := newManual(t, Config{MaxParked: 2}, nil, e)
	seg, _ := NewSegmenter("line")
	for _, id := range []string{"a", "b", "c"} {
		st := submit(t, s, Request{ID: id, Prompt: prompt(3), MaxTokens: 10, Segment: seg, Decoder: &textDecoder{words: []string{"x\n"}}})
		drive(t, s, 100)
		if _, _, r := collect(t, st); r.Reason != ReasonSegment {
			t.Fatalf("%s ended %v, want parked", id, r.Reason)
		}
		clock.Add(time.Second)
	}
	if st := s.Stats(); st.Parked != 2 || st.Expired != 1 {
		t.Errorf("parked %d, expired %d; want 2 and 1", st.Parked, st.Expired)
	}
	if _, err := s.Resume(context.Background(), "a", ResumeOptions{}); !errors.Is(err, ErrNotParked) {
		t.Errorf("resume of the oldest: %v, want ErrNotParked", err)
	}
	for _, id := range []string{"b", "c"} {
		if err := s.Discard(id); err != nil {
			t.Errorf("discard %s: %v", id, err)
		}
	}
	drive(t, s, 10)
	if len(e.seqs) != 0 || s.Stats().Parked != 0 {
		t.Errorf("%d sequences and %d parked left", len(e.seqs), s.Stats().Parked)
	}
}

func TestShedSegmentedRequestResumed(t *testing.T) {
	// A segmented request with 3 mandatory tokens is shed after its
	// first, then parks at the end of its first line. Its shed tokens
	// count once, when it ends; a resume with a new budget makes it whole
	// again: it ends at that budget as "length" with nothing shed, and
	// what it may still generate can be shed anew.
	shedAndPark := func(t *testing.T) (*Scheduler, *Result) {
		t.Helper()
		s, _ := newManual(t, Config{MaxBatch: 1}, nil, newFakeEngine(nil))
		seg, _ := NewSegmenter("line")
		dec := &textDecoder{words: []string{"a ", "b\n", "c ", "d ", "e ", "f\n"}}
		st := submit(t, s, Request{ID: "r", Prompt: prompt(3), MinTokens: 3, MaxTokens: 50, Segment: seg, Decoder: dec})
		stepLane(s, 0)
		urgent := submit(t, s, Request{ID: "urgent", Prompt: prompt(3), MaxTokens: 5, Deadline: time.Millisecond})
		drive(t, s, 200)
		collect(t, urgent)
		_, _, r := collect(t, st)
		if r.Reason != ReasonSegment || r.TotalGenerated != 2 || s.Stats().ShedRequests != 1 {
			t.Fatalf("first segment: %v after %d tokens, %d shed requests; want a segment of 2 tokens, shed", r.Reason, r.TotalGenerated, s.Stats().ShedRequests)
		}
		return s, r
	}

	t.Run("same budget", func(t *testing.T) {
		s, first := shedAndPark(t)
		st, err := s.Resume(context.Background(), "r", ResumeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		drive(t, s, 200)
		_, _, r := collect(t, st)
		if r.Reason != ReasonShed || r.TotalGenerated != 3 {
			t.Errorf("resumed: %v after %d tokens; want shed at its 3 mandatory tokens", r.Reason, r.TotalGenerated)
		}
		if first.ShedTokens != 0 || r.ShedTokens != 47 || s.Stats().ShedTokens != 47 {
			t.Errorf("shed tokens %d on the segment, %d at the end, %d in stats; want 0, 47, 47", first.ShedTokens, r.ShedTokens, s.Stats().ShedTokens)
		}
	})

	t.Run("new budget", func(t *testing.T) {
		s, _ := shedAndPark(t)
		st, err := s.Resume(context.Background(), "r", ResumeOptions{MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		tk := s.tasks["r"]
		if !slices.Contains(s.withOptional, tk) || optional(tk) != 2 {
			t.Errorf("resumed with 3 more tokens, %d of them optional, listed %v; want 2 optional, listed", optional(tk), slices.Contains(s.withOptional, tk))
		}
		drive(t, s, 200)
		_, _, r := collect(t, st)
		if r.Reason != ReasonLength || r.TotalGenerated != 5 || r.ShedTokens != 0 || s.Stats().ShedTokens != 0 {
			t.Errorf("resumed: %v after %d tokens, %d shed (%d in stats); want length at 5, none shed", r.Reason, r.TotalGenerated, r.ShedTokens, s.Stats().ShedTokens)
		}
	})

	t.Run("new budget shed again", func(t *testing.T) {
		s, _ := shedAndPark(t)
		st, err := s.Resume(context.Background(), "r", ResumeOptions{MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		stepLane(s, 0)
		urgent := submit(t, s, Request{ID: "urgent2", Prompt: prompt(3), MaxTokens: 5, Deadline: time.Millisecond})
		drive(t, s, 200)
		collect(t, urgent)
		_, _, r := collect(t, st)
		if r.Reason != ReasonShed || r.TotalGenerated != 3 || r.ShedTokens != 9 || s.Stats().ShedTokens != 9 {
			t.Errorf("resumed: %v after %d tokens, %d shed (%d in stats); want shed at 3, 9 of the new budget of 12 shed", r.Reason, r.TotalGenerated, r.ShedTokens, s.Stats().ShedTokens)
		}
	})
}

func TestSubmitWithATakenIDSaysWhatHoldsIt(t *testing.T) {
	s, _ := newManual(t, Config{}, nil, newFakeEngine(nil))
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a\n", "b ", "c\n"}}
	st := submit(t, s, Request{ID: "plan", Prompt: prompt(3), MaxTokens: 50, Segment: seg, Decoder: dec})
	chat := submit(t, s, Request{ID: "chat", Prompt: prompt(3), MaxTokens: 50})
	stepLane(s, 0)
	for _, tc := range []struct{ id, want string }{
		{"chat", "still generating"},
		{"plan", "parked"},
	} {
		if tc.id == "plan" {
			drive(t, s, 100)
			collect(t, st)
			collect(t, chat)
		}
		_, err := s.Submit(context.Background(), Request{ID: tc.id, Prompt: prompt(3), MaxTokens: 5})
		if !errors.Is(err, ErrIDInUse) || !errors.Is(err, ErrInvalid) || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Submit with %s's id: %v; want ErrIDInUse and ErrInvalid saying %q", tc.id, err, tc.want)
		}
	}
}

// TestResumedOnAMuchSlowerLaneFinishes: a request whose KV cache lives on
// a lane that became much slower than the other is served there when it
// comes back. Only that lane can run it without rebuilding its cache, so
// the check that keeps long requests off a slow lane must not hold it
// back: before, the slow lane refused it (it would finish sooner on the
// fast lane after its backlog), the fast lane skipped it (its sequence is
// on the other lane), and it waited forever.
func TestResumedOnAMuchSlowerLaneFinishes(t *testing.T) {
	s, _ := newManual(t, Config{MaxBatch: 2}, nil, newFakeEngine(nil), newFakeEngine(nil))
	seg, _ := NewSegmenter("line")
	dec := &textDecoder{words: []string{"a ", "b\n", "c ", "d ", "e ", "f ", "g\n"}}
	st := submit(t, s, Request{ID: "r", Prompt: prompt(4), MaxTokens: 40, Segment: seg, Decoder: dec})
	// Neither lane's costs are known, so they count as alike: the second
	// lane takes the request and parks it there after its first line.
	for range 10 {
		step := s.Begin(1)
		if step == nil {
			break
		}
		step.Run(context.Background())
		s.End(step)
	}
	if _, text, r := collect(t, st); r.Reason != ReasonSegment || r.Lane != 1 || text != "a b\n" {
		t.Fatalf("first segment %q on lane %d, ended %v; want \"a b\\n\" on lane 1, parked", text, r.Lane, r.Reason)
	}
	s.SeedCost(0, time.Millisecond, time.Millisecond, 10*time.Microsecond)
	s.SeedCost(1, 3*time.Millisecond, 3*time.Millisecond, 30*time.Microsecond)
	if _, slow := s.muchSlower(s.lanes[1]); !slow {
		t.Fatal("lane 1 is not much slower after its seeded costs")
	}
	st, err := s.Resume(context.Background(), "r", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, 1000)
	select {
	case <-st.Done():
	default:
		t.Fatalf("the resumed request waits with %d requests in the queues; want it served by the lane holding its cache", s.waitingCount())
	}
	if _, text, r := collect(t, st); r.Lane != 1 || text != "c d e f g\n" {
		t.Errorf("second segment %q on lane %d, want \"c d e f g\\n\" on lane 1", text, r.Lane)
	}
}
