package progress

import (
	"bytes"
	"strings"
	"testing"
)

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 29: "1.5 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSilentOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "x", 100)
	b.Set(50)
	b.Done()
	if buf.Len() != 0 {
		t.Errorf("bar drew %q on a non-terminal", buf.String())
	}
}

func TestDrawsWhenEnabled(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "synth", 4<<20)
	b.enabled = true // a terminal, as far as the bar is concerned
	b.Set(1 << 20)
	first := buf.String()
	if !strings.HasPrefix(first, "\rsynth [") || !strings.Contains(first, " 25.0%") {
		t.Errorf("first draw %q", first)
	}
	if !strings.Contains(first, "["+strings.Repeat("=", 7)+strings.Repeat(" ", 23)+"]") {
		t.Errorf("bar width for 25%%: %q", first)
	}
	b.Done()
	rest := strings.TrimPrefix(buf.String(), first)
	if !strings.Contains(rest, "100.0%") || !strings.HasSuffix(rest, "\n") || !strings.Contains(rest, "eta --") {
		t.Errorf("final draw %q", rest)
	}
}

func TestCountsItems(t *testing.T) {
	var buf bytes.Buffer
	b := NewCount(&buf, "generate", 8, "prompts")
	b.enabled = true
	b.Set(2)
	if s := buf.String(); !strings.Contains(s, " 25.0% 2/8 prompts, ") || strings.Contains(s, "B/s") {
		t.Errorf("count draw %q, want 2/8 prompts and no bytes", s)
	}
}
