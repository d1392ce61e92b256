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
	interruptChild(t, startChild(t, "TestInterruptRemovesTrackedPaths", "INTERRUPT_CHILD_DIR="+dir))
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
	Handle(os.Stderr, "test")
	Track(filepath.Join(dir, "model.gguf.tmp1"))
	Track(filepath.Join(dir, "bench"))
	Track(filepath.Join(dir, "done.gguf"))() // finished: untracked
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Minute)
	os.Exit(3) // not interrupted
}

// TestInterruptDuringCreateLeavesNothing interrupts a child that makes,
// removes and untracks temporary files in a tight loop, at five moments:
// wherever the signal lands, no file may be left. With the file made and
// then tracked in two steps, one landing between them left it.
func TestInterruptDuringCreateLeavesNothing(t *testing.T) {
	if dir := os.Getenv("INTERRUPT_CREATE_DIR"); dir != "" {
		createChild(dir)
		return
	}
	for i := range 5 {
		dir := t.TempDir()
		cmd := startChild(t, "TestInterruptDuringCreateLeavesNothing", "INTERRUPT_CREATE_DIR="+dir)
		time.Sleep(time.Duration(i) * 3 * time.Millisecond)
		interruptChild(t, cmd)
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Fatalf("interrupt %d: left %v", i, left)
		}
	}
}

// startChild runs this test binary's test with env added, and returns
// once the child printed "ready".
func startChild(t *testing.T, test, env string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env)
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
	return cmd
}

// interruptChild sends the child SIGINT; it must exit with status 130.
func interruptChild(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("child ended with %v, want exit status 130", err)
	}
}

func createChild(dir string) {
	Handle(os.Stderr, "test")
	for n := 0; ; n++ {
		f, untrack, err := CreateTemp(dir, "model.gguf.tmp*")
		if err != nil {
			os.Exit(4)
		}
		f.Close()
		os.Remove(f.Name())
		untrack()
		if n == 0 {
			os.Stdout.WriteString("ready\n")
		}
	}
}

func TestStopEndsTheHandler(t *testing.T) {
	// After stop, the signal's default action is back: nothing here may
	// exit the test process, and tracking still balances.
	stop := Handle(os.Stderr, "test")
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
