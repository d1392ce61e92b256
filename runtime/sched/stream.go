package sched

import (
	"context"
	"io"
	"sync"
)

// Stream delivers one request's events (one segment's, for segmented
// requests). The scheduler never blocks on a slow reader: events queue in
// the stream (at most one per engine step) until Recv takes them.
type Stream struct {
	id     string
	mu     sync.Mutex
	events []Event // events[head:] are queued
	head   int
	// pendFrom is where the last queued event's tokens begin in the
	// request's generated tokens (which are only ever appended to), or -1
	// when they are not such a view.
	pendFrom int
	done     bool // the final event was queued
	read     bool // the final event was received
	// waiters counts the Recv calls waiting on ready. Only then does a
	// push signal: a reader that takes the final result (Wait) or drains
	// the queue without waiting costs no channel operation per step.
	waiters int
	ready   chan struct{}
	result  *Result
	// finished is closed when the final event is queued.
	finished chan struct{}
}

func newStream(id string) *Stream {
	return &Stream{id: id, pendFrom: -1, ready: make(chan struct{}, 1), finished: make(chan struct{})}
}

// ID is the request's id (for Resume).
func (s *Stream) ID() string { return s.id }

// Recv returns the next event, waiting for one. After the final event
// (Done set) it returns io.EOF. It returns ctx's error if ctx ends first;
// that does not cancel the request (the context given to Submit does).
func (s *Stream) Recv(ctx context.Context) (Event, error) {
	waited := false
	for {
		s.mu.Lock()
		if waited {
			s.waiters--
			waited = false
		}
		if s.head < len(s.events) {
			ev := s.events[s.head]
			s.events[s.head] = Event{}
			s.head++
			if s.head == len(s.events) {
				s.events, s.head = s.events[:0], 0 // reuse the buffer
			}
			if ev.Done {
				s.read = true
			}
			s.mu.Unlock()
			return ev, nil
		}
		if s.read {
			s.mu.Unlock()
			return Event{}, io.EOF
		}
		s.waiters++
		waited = true
		s.mu.Unlock()
		select {
		case <-s.ready:
		case <-s.finished: // wakes every reader, not just one
		case <-ctx.Done():
			s.mu.Lock()
			s.waiters--
			s.mu.Unlock()
			return Event{}, ctx.Err()
		}
	}
}

// Done is closed when the stream has its final event queued.
func (s *Stream) Done() <-chan struct{} { return s.finished }

// Result returns the final result, or nil before the stream ended.
func (s *Stream) Result() *Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.result
}

// Wait waits for the end of the stream, discarding events, and returns
// its result.
func (s *Stream) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-s.finished:
		return s.Result(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// push queues an event; it reports false when the stream already ended.
func (s *Stream) push(ev *Event) bool { return s.pushFrom(ev, nil) }

// pushFrom queues an event whose Tokens, if any, are the tail of gen: the
// request's generated tokens, which are only ever appended to.
func (s *Stream) pushFrom(ev *Event, gen []int32) bool {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return false
	}
	// Merge into a pending token event so a slow reader's backlog stays
	// one event per kind, not one per step.
	if n := len(s.events); n > s.head && !ev.Done && !s.events[n-1].Done {
		last := &s.events[n-1]
		if from := s.pendFrom; from >= 0 && isTail(ev.Tokens, gen) && from+len(last.Tokens) == len(gen)-len(ev.Tokens) {
			// gen[from:] holds the pending tokens and the new ones: a
			// longer view of it replaces a copy. A reader that takes
			// events only now and then (or never: Wait) would otherwise
			// cost a copy of every token it has not taken yet.
			last.Tokens = gen[from:len(gen):len(gen)]
		} else {
			last.Tokens = append(last.Tokens, ev.Tokens...)
			s.pendFrom = -1
		}
		last.Text += ev.Text
		last.Time = ev.Time
	} else {
		s.events = append(s.events, *ev)
		s.pendFrom = -1
		if !ev.Done && len(ev.Tokens) > 0 && isTail(ev.Tokens, gen) {
			s.pendFrom = len(gen) - len(ev.Tokens)
		}
	}
	if ev.Done {
		s.done = true
		s.result = ev.Result
		close(s.finished)
	}
	wake := s.waiters > 0
	s.mu.Unlock()
	if wake {
		select {
		case s.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// isTail reports whether toks is a view of gen's last len(toks) elements.
func isTail(toks, gen []int32) bool {
	m := len(toks)
	return m > 0 && m <= len(gen) && &gen[len(gen)-m] == &toks[0]
}
