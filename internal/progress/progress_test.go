package progress

import (
	"bytes"
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
