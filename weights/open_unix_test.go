//go:build unix

package weights

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOpenRefusesAPipe: a named pipe given as a model is refused at once;
// opening it to read blocked until a writer came, which was never.
func TestOpenRefusesAPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "model.gguf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/null"} {
		done := make(chan error, 1)
		go func() {
			_, err := Open(path)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("Open(%s): %v, want it refused as not a regular file", path, err)
			}
		case <-time.After(time.Minute): // a hang detector, not a timing
			t.Fatalf("Open(%s) blocked", path)
		}
	}
}
