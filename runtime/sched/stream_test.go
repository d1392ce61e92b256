package sched

import (
	"context"
	"slices"
	"testing"
)

func TestStreamMergesTokensAsAViewForASlowReader(t *testing.T) {
	st := newStream("x")
	var gen []int32
	var want []int32
	emit := func(toks ...int32) {
		start := len(gen)
		gen = append(gen, toks...) // reallocates now and then, as t.generated does
		want = append(want, toks...)
		st.pushFrom(Event{Tokens: gen[start:len(gen):len(gen)]}, gen)
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
	st.pushFrom(Event{Tokens: []int32{7}}, gen)
	st.pushFrom(Event{Tokens: []int32{8}}, gen)
	if got := recv(); !slices.Equal(got, []int32{7, 8}) {
		t.Errorf("tokens from elsewhere: %v, want [7 8]", got)
	}
}
