package progress

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
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
	b.mode = drawn // a terminal, as far as the bar is concerned
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
	b.mode = drawn
	b.Set(2)
	if s := buf.String(); !strings.Contains(s, " 25.0% 2/8 prompts, ") || strings.Contains(s, "B/s") {
		t.Errorf("count draw %q, want 2/8 prompts and no bytes", s)
	}
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestLogsLinesOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := newBar(&buf, "real-engine runs", 36, logged, clock.now)
	b.unit = "runs"
	clock.t = clock.t.Add(5 * time.Second)
	b.Set(2)
	if buf.Len() != 0 {
		t.Fatalf("a job 5 s old logged %q; want nothing before %v", buf.String(), logFirst)
	}
	clock.t = clock.t.Add(7 * time.Second) // 12 s in
	b.Set(12)
	first := buf.String()
	if want := "real-engine runs: 12 of 36 runs (33.3%), 1/s, eta 24s\n"; first != want {
		t.Errorf("first line %q, want %q", first, want)
	}
	clock.t = clock.t.Add(logEvery - time.Second)
	b.Set(20)
	if buf.String() != first {
		t.Errorf("logged again %v after the first line: %q", logEvery-time.Second, buf.String())
	}
	clock.t = clock.t.Add(time.Second)
	b.Set(24)
	if lines := strings.Count(buf.String(), "\n"); lines != 2 || strings.Contains(buf.String(), "\r") {
		t.Errorf("after %v: %d lines %q, want 2 plain lines", logEvery, lines, buf.String())
	}
	b.Done()
	if !strings.HasSuffix(buf.String(), "real-engine runs: done in 42s\n") {
		t.Errorf("last line of %q, want the time the job took", buf.String())
	}
}

func TestLogsBytesOfUnknownTotal(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := newBar(&buf, "convert", 0, logged, clock.now)
	clock.t = clock.t.Add(16 * time.Second)
	b.Set(32 << 20)
	if want := "convert: 32.0 MiB, 2.0 MiB/s\n"; buf.String() != want {
		t.Errorf("line %q, want %q", buf.String(), want)
	}
}

func TestQuickJobLeavesLogClean(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := newBar(&buf, "synth", 100, logged, clock.now)
	clock.t = clock.t.Add(3 * time.Second)
	b.Set(100)
	b.Done()
	if buf.Len() != 0 {
		t.Errorf("a 3 s job logged %q", buf.String())
	}
}

func TestFilesAreLogged(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m := New(f, "x", 1).mode; m != logged {
		t.Errorf("a regular file gets mode %d, want logged (%d)", m, logged)
	}
	if m := New(&bytes.Buffer{}, "x", 1).mode; m != silent {
		t.Errorf("a buffer gets mode %d, want silent (%d)", m, silent)
	}
}
