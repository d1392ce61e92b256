//go:build unix

package testutil

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RefusesAPipe checks that open refuses a named pipe and /dev/null as not
// regular files, without blocking: opening a pipe to read waits for a
// writer, which for a model or tokenizer path never comes.
func RefusesAPipe(t *testing.T, open func(path string) error) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "model.gguf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/null"} {
		done := make(chan error, 1)
		go func() { done <- open(path) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("opening %s: %v, want it refused as not a regular file", path, err)
			}
		case <-time.After(time.Minute): // a hang detector, not a timing
			t.Fatalf("opening %s blocked", path)
		}
	}
}
