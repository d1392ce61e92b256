//go:build unix

package interrupt

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestInterruptRemovesTrackedPaths runs a child that tracks a file and a
// directory and waits; SIGINT must remove both (and not an untracked
// file) and end it with status 130.
func TestInterruptRemovesTrackedPaths(t *testing.T) {
	if dir := os.Getenv("INTERRUPT_CHILD_DIR"); dir != "" {
		child(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptRemovesTrackedPaths$")
	cmd.Env = append(os.Environ(), "INTERRUPT_CHILD_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Errorf("child ended with %v, want exit status 130", err)
	}
	for _, name := range []string{"model.gguf.tmp1", "bench"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the interrupt: %v", name, err)
		}
	}
	for _, name := range []string{"done.gguf", "kept"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s removed, but it was untracked or never tracked: %v", name, err)
		}
	}
}

func child(dir string) {
	os.WriteFile(filepath.Join(dir, "model.gguf.tmp1"), []byte("half"), 0o644)
	os.MkdirAll(filepath.Join(dir, "bench", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "done.gguf"), []byte("whole"), 0o644)
	os.WriteFile(filepath.Join(dir, "kept"), []byte("x"), 0o644)
	Handle(os.Stderr)
	Track(filepath.Join(dir, "model.gguf.tmp1"))
	Track(filepath.Join(dir, "bench"))
	Track(filepath.Join(dir, "done.gguf"))() // finished: untracked
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Minute)
	os.Exit(3) // not interrupted
}

func TestStopEndsTheHandler(t *testing.T) {
	// After stop, the signal's default action is back: nothing here may
	// exit the test process, and tracking still balances.
	stop := Handle(os.Stderr)
	stop()
	stop()
	untrack := Track("x")
	untrack()
	untrack()
	mu.Lock()
	defer mu.Unlock()
	if len(tracked) != 0 {
		t.Errorf("tracked after untrack: %v", tracked)
	}
}
