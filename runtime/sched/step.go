package sched

import (
	"context"
	"errors"
	"slices"
	"time"
)

// Step is one planned engine step of a lane: the sequences to free, the
// ones to start, and the members to advance. The lane goroutine runs
// Begin, Run, End in a loop; a simulator calls them itself (Config.Manual)
// and moves its clock between Run and End.
type Step struct {
	s     *Scheduler
	l     *lane
	begin time.Time

	frees   []SeqID
	trims   []chan trimmed // TrimMemory calls to answer after the frees
	tasks   []*task        // members, in batch order
	members []stepMember   // tasks[i]'s part of the step, copied under the lock for Run

	// filled by Run
	mem        []Member
	memIdx     []int // mem[j] is members[memIdx[j]]
	out        []StepOut
	err        error
	freeErr    error
	engineWall time.Duration
}

// stepMember is one member's part of a Step: what Run needs from its task
// and what Run's Start returns. One record per member, not a slice per
// field: after an engine step has evicted the scheduler's data, each
// slice read cost delivery a cache miss.
type stepMember struct {
	seq      SeqID
	limit    int
	starting bool // Run starts the sequence first, with start
	start    []int32
	startErr error
}

// Members is the number of sequences the step advances.
func (st *Step) Members() int { return len(st.tasks) }

// EngineWall is the wall time Run spent in Engine.Step.
func (st *Step) EngineWall() time.Duration { return st.engineWall }

// Begin plans lane i's next step, or returns nil when the lane has nothing
// to do. For simulators (Config.Manual); the lane goroutines call it
// otherwise. A lane has one step at a time: call End before the lane's
// next Begin (the Step's memory is reused).
func (s *Scheduler) Begin(i int) *Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	wall, now := s.clock()
	l := s.lanes[i]
	st := s.begin(l, now)
	l.schedWall += time.Since(wall)
	return st
}

// begin plans l's next step at now; s.mu is held.
func (s *Scheduler) begin(l *lane, now time.Time) *Step {
	for i := 0; i < len(l.running); {
		if t := l.running[i]; t.cancel != nil {
			s.end(t, ReasonCancelled, t.cancel, nil, now)
			continue // end removed it from l.running
		}
		i++
	}
	if !s.stopped {
		s.expireParked(now)
		// The cap holds for the whole plan: it depends on the deadlines
		// arriving and the lane's costs, which planning does not change.
		limit := s.batchCap(l, now)
		refused := s.admit(l, now, limit)
		if s.feat.shedding && s.shed(l, now, refused) {
			s.admit(l, now, limit)
		}
		// Preemption is admission control's other half: it makes room
		// where keeping new members out is not enough.
		if s.feat.admission && s.preempt(l, now, limit) {
			s.admit(l, now, limit)
		}
	}
	if len(l.running) == 0 && len(l.toFree) == 0 && len(l.trims) == 0 {
		s.noteIdle(now)
		return nil
	}
	s.stallSince = time.Time{}
	// A lane has one step in flight: its buffers are reused.
	st := &l.step
	*st = Step{s: s, l: l, begin: now, frees: append(st.frees[:0], l.toFree...), trims: append(st.trims[:0], l.trims...),
		tasks: st.tasks[:0], members: st.members[:0], mem: st.mem[:0], memIdx: st.memIdx[:0], out: st.out[:0]}
	l.toFree = l.toFree[:0]
	clear(l.trims)
	l.trims = l.trims[:0]
	for _, t := range l.running {
		st.tasks = append(st.tasks, t)
		m := stepMember{seq: t.seq, limit: max(1, t.maxTokens-len(t.generated)), starting: t.starting}
		if t.starting {
			// Start copies its tokens. A rebuilt sequence re-evaluates
			// what it generated.
			m.start = t.req.Prompt
			if len(t.generated) > 0 {
				m.start = append(append(make([]int32, 0, t.promptLen+len(t.generated)), t.req.Prompt...), t.generated...)
			}
		}
		st.members = append(st.members, m)
	}
	l.busy = true
	return st
}

// noteIdle records when a lane finds nothing to do: if every lane is
// idle and requests wait, they wait for nothing (a planning bug), and
// stallSince starts counting.
func (s *Scheduler) noteIdle(now time.Time) {
	if !s.allIdle() || s.waitingCount() == 0 {
		s.stallSince = time.Time{}
		return
	}
	if s.stallSince.IsZero() {
		s.stallSince = now
		s.watchStall(stallCheck)
	}
}

// allIdle reports whether no lane runs a request or is mid-step.
func (s *Scheduler) allIdle() bool {
	for _, o := range s.lanes {
		if o.busy || len(o.running) > 0 {
			return false
		}
	}
	return true
}

// Run frees, starts and steps the engine. It touches only the Step, the
// engine and what its tasks fixed at Submit, so the scheduler stays
// unlocked meanwhile.
func (st *Step) Run(ctx context.Context) error {
	eng := st.l.eng
	for _, id := range st.frees {
		if err := eng.Free(id); err != nil {
			st.freeErr = errors.Join(st.freeErr, err)
		}
	}
	if len(st.trims) > 0 {
		// After the frees: the rows they kept go too.
		var r trimmed
		if t, ok := eng.(kvTrimmer); ok {
			r.bytes, r.err = t.TrimKV()
		}
		for _, w := range st.trims {
			w <- r
		}
		clear(st.trims)
		st.trims = st.trims[:0]
	}
	st.mem, st.memIdx = st.mem[:0], st.memIdx[:0]
	for i := range st.members {
		m := &st.members[i]
		if m.starting {
			// id and sampler are fixed at Submit: read unlocked.
			t := st.tasks[i]
			m.seq, m.startErr = eng.Start(m.start, t.sampler, t.id)
			if m.startErr != nil {
				continue
			}
		}
		st.mem = append(st.mem, Member{Seq: m.seq, Limit: m.limit})
		st.memIdx = append(st.memIdx, i)
	}
	if len(st.mem) == 0 {
		return nil
	}
	st.out = slices.Grow(st.out[:0], len(st.mem))[:len(st.mem)]
	t0 := time.Now()
	st.err = eng.Step(ctx, st.mem, st.out)
	st.engineWall = time.Since(t0)
	return st.err
}

// End delivers a step's results: tokens to streams, finished and parked
// requests out of the batch, and the step's duration (by Config.Now) to
// the lane's cost model.
func (s *Scheduler) End(st *Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wall, now := s.clock()
	s.deliver(st, now)
	st.l.schedWall += time.Since(wall)
}

// deliver is End with s.mu held.
func (s *Scheduler) deliver(st *Step, now time.Time) {
	l := st.l
	l.busy = false
	l.engineWall += st.engineWall
	if st.freeErr != nil {
		s.stats.freeErrors++
	}
	for i := range st.members {
		m := &st.members[i]
		if !m.starting {
			continue
		}
		t, err := st.tasks[i], m.startErr
		if t.state != running || !t.starting {
			// Ended while its Start was in flight (end released the
			// slot): free what the Start allocated.
			if err == nil {
				l.toFree = append(l.toFree, m.seq)
				l.cond.Signal()
			}
			continue
		}
		t.starting = false
		if err != nil {
			l.held--
			s.end(t, ReasonError, err, nil, now)
			continue
		}
		t.seq, t.hasSeq, t.prefilling = m.seq, true, true
	}
	if len(st.mem) == 0 {
		return
	}
	l.steps++
	l.stepClock += now.Sub(st.begin)
	var sc stepCost
	decodeTokens := 0
	for j, i := range st.memIdx {
		t, o := st.tasks[i], &st.out[j]
		if t.state != running || t.lane != l.idx {
			continue
		}
		switch {
		case st.err != nil:
			s.end(t, ReasonError, st.err, nil, now)
			continue
		case o.Err != nil:
			s.end(t, ReasonError, o.Err, nil, now)
			continue
		}
		if o.Prefilled > 0 {
			sc.prefill += o.Prefilled
		} else if len(o.Tokens) > 0 {
			sc.decode++
			decodeTokens += len(o.Tokens)
		}
		if t.cancel != nil {
			s.end(t, ReasonCancelled, t.cancel, nil, now)
			continue
		}
		if len(o.Tokens) == 0 {
			continue
		}
		t.prefilling = false
		var ev Event
		s.consume(t, o.Tokens, &ev, now)
		if t.state == running {
			s.push(t, &ev, now)
		}
	}
	if st.err == nil {
		sc.dur = now.Sub(st.begin)
		l.cost.observe(sc, decodeTokens)
	}
}

// consume delivers generated tokens to t's event (which holds no tokens
// yet), ending or parking it when a stop, a segment end or a limit is
// reached. A stop or a limit on the token that completes a segment ends
// the request: a parked request always has tokens left to generate.
func (s *Scheduler) consume(t *task, toks []int32, ev *Event, now time.Time) {
	l := s.lanes[max(t.lane, 0)]
	ctxLen := l.info.Context
	// The event's tokens are a capped view of t.generated, which is only
	// ever appended to, so the view never changes: no copy per event.
	start := len(t.generated)
	for i, tok := range toks {
		if isStop(t.req.StopTokens, tok) {
			s.flushText(t, ev)
			s.endAt(t, ReasonStop, ev, now)
			return
		}
		l.tokens++ // what the request keeps, not what the engine gave past a stop
		l.attended += uint64(t.promptLen + len(t.generated))
		t.generated = append(t.generated, tok)
		t.segTokens++
		if t.firstTok.IsZero() {
			t.firstTok = now
		}
		n := len(t.generated)
		ev.Tokens = t.generated[start:n:n]
		if d := t.req.Decoder; d != nil {
			s.emitText(t, d.Next(tok), ev, now)
			if t.state != running && t.state != waiting {
				return
			}
		}
		if len(t.generated) >= t.maxTokens || t.promptLen+len(t.generated) >= ctxLen {
			s.flushText(t, ev)
			reason := ReasonLength
			if t.shed {
				reason = ReasonShed
			}
			s.endAt(t, reason, ev, now)
			return
		}
		if t.cut {
			s.park(t, ev, toks[i+1:], now)
			return
		}
	}
}

// endAt ends t (running or waiting) at a stop or a limit. Text past a
// segment cut the same token made is part of the answer: there is no next
// segment.
func (s *Scheduler) endAt(t *task, reason Reason, ev *Event, now time.Time) {
	if t.cut {
		ev.Text += t.restText
		t.restText, t.cut = "", false
	}
	s.end(t, reason, nil, ev, now)
}

func isStop(stops []int32, tok int32) bool {
	for _, s := range stops {
		if s == tok {
			return true
		}
	}
	return false
}

// emitText adds newly decoded text: it ends the request at a stop string
// and holds back a tail that may begin one.
func (s *Scheduler) emitText(t *task, text string, ev *Event, now time.Time) {
	if text == "" {
		return
	}
	vis := t.held + text
	t.held = ""
	if stops := t.req.StopText; len(stops) > 0 {
		if at := firstStop(vis, stops); at >= 0 {
			s.deliverText(t, vis[:at], ev)
			s.endAt(t, ReasonStop, ev, now)
			return
		}
		hb := holdback(vis, stops)
		t.held = vis[len(vis)-hb:]
		vis = vis[:len(vis)-hb]
	}
	s.deliverText(t, vis, ev)
}

// flushText releases held-back text and the decoder's partial character:
// the request ends here, so neither can still become a stop string.
func (s *Scheduler) flushText(t *task, ev *Event) {
	if t.req.Decoder == nil {
		return
	}
	rest := t.held + t.req.Decoder.Flush()
	t.held = ""
	s.deliverText(t, rest, ev)
}

// deliverText appends text to the event up to the end of the current
// segment. Once a segment is complete (t.cut), text goes to restText,
// which opens the next one: the caller parks t after the token, unless a
// stop or a limit ends it there.
func (s *Scheduler) deliverText(t *task, text string, ev *Event) {
	if text == "" {
		return
	}
	if t.cut {
		t.restText += text
		return
	}
	if t.req.Segment == nil {
		ev.Text += text
		return
	}
	old := len(t.segText)
	t.segText += text
	cut := t.req.Segment.Cut(t.segText)
	if cut < 0 {
		ev.Text += text
		return
	}
	before := max(0, cut-old)
	ev.Text += text[:before]
	t.restText = text[before:]
	t.segText = ""
	t.cut = true
}

// firstStop returns the index of the earliest stop string in text, or -1.
func firstStop(text string, stops []string) int {
	best := -1
	for _, st := range stops {
		if i := indexOf(text, st); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// holdback is the length of the longest tail of text that is a proper
// prefix of a stop string.
func holdback(text string, stops []string) int {
	best := 0
	for _, st := range stops {
		for n := min(len(st)-1, len(text)); n > best; n-- {
			if text[len(text)-n:] == st[:n] {
				best = n
				break
			}
		}
	}
	return best
}

// push sends a token event, if it carries anything.
func (s *Scheduler) push(t *task, ev *Event, now time.Time) {
	if len(ev.Tokens) == 0 && ev.Text == "" {
		return
	}
	ev.Time = now
	t.stream.pushFrom(ev, t.generated)
}

// park ends the current segment (t.cut) and keeps the sequence for
// Resume, with the text and the tokens generated past the cut (carry) to
// open the next one.
func (s *Scheduler) park(t *task, ev *Event, carry []int32, now time.Time) {
	t.restText += t.held
	t.held, t.cut = "", false
	t.carry = append(t.carry, carry...)
	res := s.detach(t, ReasonSegment, nil, ev, now)
	t.state = parked
	t.parkedAt = now
	s.parked = append(s.parked, t)
	if t.hasSeq {
		l := s.lanes[t.lane]
		l.parked = append(l.parked, t)
	}
	t.stream.push(&Event{Done: true, Result: res, Time: now})
	if len(s.parked) > s.cfg.MaxParked && s.parked[0] != t {
		s.dropParked(s.parked[0]) // the oldest
		s.stats.expired++
	}
}

// end finishes t: the pending event, then the final one. The sequence is
// queued for freeing.
func (s *Scheduler) end(t *task, reason Reason, err error, ev *Event, now time.Time) {
	res := s.detach(t, reason, err, ev, now)
	s.releaseSeq(t)
	t.state = done
	delete(s.tasks, t.id)
	t.stream.push(&Event{Done: true, Result: res, Time: now})
}

// detach ends t's current stream: it delivers the pending event, counts
// the result and takes t out of its batch or queue.
func (s *Scheduler) detach(t *task, reason Reason, err error, ev *Event, now time.Time) *Result {
	if ev != nil {
		s.push(t, ev, now)
		*ev = Event{}
	}
	res := s.result(t, reason, err, now)
	if reason == ReasonSegment {
		res.Resumable = true
	}
	s.record(res)
	if t.inDeadline {
		s.unlistDeadline(t)
	}
	s.unlistOptional(t)
	if t.stopCtx != nil {
		t.stopCtx()
		t.stopCtx = nil
	}
	switch t.state {
	case running:
		l := s.lanes[t.lane]
		l.running = removeTask(l.running, t)
		if t.starting {
			// Its Start is in flight: End frees what it allocates.
			t.starting = false
			l.held--
		}
	case waiting:
		s.removeWaiting(t)
	}
	return res
}

// finish ends a task with no pending event.
func (s *Scheduler) finish(t *task, reason Reason, err error, now time.Time) {
	s.end(t, reason, err, nil, now)
}

func (s *Scheduler) result(t *task, reason Reason, err error, now time.Time) *Result {
	res := &Result{
		ID: t.id, Reason: reason, Err: err,
		PromptTokens: t.promptLen, CompletionTokens: t.segTokens, TotalGenerated: len(t.generated),
		Arrival: t.arrival, Finish: now, Lane: max(t.lane, 0), Score: t.score,
		HasDeadline: !t.deadline.IsZero(),
	}
	if t.segTokens > 0 {
		res.FirstToken = t.firstTok
	}
	// Counted once, when the request ends: a parked one may yet be
	// resumed with a new budget.
	if t.shed && reason != ReasonSegment {
		res.ShedTokens = max(0, t.req.MaxTokens-len(t.generated))
	}
	switch reason {
	case ReasonCancelled, ReasonError:
	default:
		late := time.Duration(0)
		if res.HasDeadline {
			late = now.Sub(t.deadline)
			res.DeadlineMet = late <= 0
		}
		res.Utility = t.req.Utility.At(late, t.relDL)
	}
	return res
}
