package sched

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"
)

func TestStreamMergesTokensAsAViewForASlowReader(t *testing.T) {
	st := newStream("x")
	var gen []int32
	var want []int32
	emit := func(toks ...int32) {
		start := len(gen)
		gen = append(gen, toks...) // reallocates now and then, as t.generated does
		want = append(want, toks...)
		st.pushFrom(&Event{Tokens: gen[start:len(gen):len(gen)]}, gen)
	}
	recv := func() []int32 {
		ev, err := st.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ev.Tokens
	}
	for i := range 100 {
		emit(int32(i))
	}
	got := recv()
	if !slices.Equal(got, want) {
		t.Fatalf("one event for 100 unread steps holds %v, want %v", got, want)
	}
	if &got[0] != &gen[0] {
		t.Errorf("the merged event is a copy, not a view of the generated tokens")
	}
	// After a read the next pending event starts where the reader left off.
	want = want[:0]
	emit(1000, 1001)
	emit(1002)
	if got := recv(); !slices.Equal(got, want) {
		t.Errorf("after a read: %v, want %v", got, want)
	}
	// Tokens that are not a view of gen are copied, as before.
	st.pushFrom(&Event{Tokens: []int32{7}}, gen)
	st.pushFrom(&Event{Tokens: []int32{8}}, gen)
	if got := recv(); !slices.Equal(got, []int32{7, 8}) {
		t.Errorf("tokens from elsewhere: %v, want [7 8]", got)
	}
}

// A push signals only a reader that waits: one that takes events as they
// come (or only the final result) costs no channel operation, and one
// that waits, or gave up waiting, is not stranded.
func TestStreamSignalsOnlyWaitingReaders(t *testing.T) {
	st := newStream("x")
	st.push(&Event{Tokens: []int32{1}})
	if n := len(st.ready); n != 0 {
		t.Fatalf("a push with no reader waiting left %d signals", n)
	}
	if ev, err := st.Recv(context.Background()); err != nil || !slices.Equal(ev.Tokens, []int32{1}) {
		t.Fatalf("Recv = %v, %v; want the queued token", ev.Tokens, err)
	}

	// A reader whose context ends while it waits leaves no waiter behind.
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error)
	go func() { _, err := st.Recv(ctx); gaveUp <- err }()
	waitForWaiters(t, st, 1)
	cancel()
	if err := <-gaveUp; err != context.Canceled {
		t.Fatalf("Recv after cancel = %v, want context.Canceled", err)
	}
	waitForWaiters(t, st, 0)

	got := make(chan Event)
	go func() {
		ev, err := st.Recv(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- ev
	}()
	waitForWaiters(t, st, 1)
	st.push(&Event{Tokens: []int32{2}})
	if ev := <-got; !slices.Equal(ev.Tokens, []int32{2}) {
		t.Fatalf("waiting reader got %v, want [2]", ev.Tokens)
	}
	st.push(&Event{Done: true, Result: &Result{ID: "x"}})
	if n := len(st.ready); n != 0 {
		t.Fatalf("the final push with no reader waiting left %d signals", n)
	}
	if res, err := st.Wait(context.Background()); err != nil || res.ID != "x" {
		t.Fatalf("Wait = %v, %v", res, err)
	}
}

// waitForWaiters blocks until n Recv calls wait on st.
func waitForWaiters(t *testing.T, st *Stream, n int) {
	t.Helper()
	for range 10000 {
		st.mu.Lock()
		w := st.waiters
		st.mu.Unlock()
		if w == n {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatalf("waiters never reached %d", n)
}

func TestFinalEventWakesEveryReader(t *testing.T) {
	st := newStream("x")
	ended := make(chan error, 2)
	for range 2 {
		go func() {
			for {
				if _, err := st.Recv(context.Background()); err != nil {
					ended <- err
					return
				}
			}
		}()
	}
	waitForWaiters(t, st, 2)
	st.push(&Event{Done: true, Result: &Result{}})
	for range 2 {
		select {
		case err := <-ended:
			if err != io.EOF {
				t.Errorf("reader ended with %v, want io.EOF", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a reader still waits in Recv after the final event")
		}
	}
}
