//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestCtrlCRemovesUnfinishedOutput interrupts inflate while it writes a
// large model, in a child process running the CLI: the temporary output
// must go, no output may appear, and the exit status must be 130.
func TestCtrlCRemovesUnfinishedOutput(t *testing.T) {
	if args := os.Getenv("TANDEM_TEST_CLI_ARGS"); args != "" {
		os.Exit(run(strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "big.gguf")
	// About 1.5 GiB of F32 weights: seconds to write, so the interrupt
	// lands mid-way.
	args := []string{"inflate", "--from", testutil.Model(t, "stories260K.gguf"), "--dims", "2048,8192,22,32,4,512", "--type", "f32", out}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCtrlCRemovesUnfinishedOutput$")
	cmd.Env = append(os.Environ(), "TANDEM_TEST_CLI_ARGS="+strings.Join(args, "\n"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupt once the temporary file exists.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if tmps, _ := filepath.Glob(out + ".tmp*"); len(tmps) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no temporary output appeared: %s", stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 || !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("inflate ended with %v, stderr %q; want exit 130 and a note", err, stderr.String())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("left after the interrupt: %v", left)
	}
}
