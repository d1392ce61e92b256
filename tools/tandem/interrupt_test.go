//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// cliChildEnv carries the command line a child test process runs.
const cliChildEnv = "TANDEM_TEST_CLI_ARGS"

func init() {
	// A child started by startCLI runs the CLI and exits with its status.
	if args := os.Getenv(cliChildEnv); args != "" {
		os.Exit(run(strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
}

// lockedBuilder collects a child's output while the test polls it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// interruptCLI runs the CLI with args in a child process, sends SIGINT
// once ready reports true of its output so far (polled every
// millisecond, for 30 s at most), and returns the exit code and output.
func interruptCLI(t *testing.T, args []string, ready func(stdout, stderr string) bool) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), cliChildEnv+"="+strings.Join(args, "\n"))
	var stdout, stderr lockedBuilder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !ready(stdout.String(), stderr.String()); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%v never got ready: %s", args, stderr.String())
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	// A command that ignores the signal is killed after 30 s: the test
	// fails rather than hangs.
	ignored := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	if !ignored.Stop() {
		t.Errorf("%v did not stop within 30 s of SIGINT", args)
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestCtrlCRemovesUnfinishedOutput interrupts inflate while it writes a
// large model: the temporary output must go, no output may appear, and
// the exit status must be 130.
func TestCtrlCRemovesUnfinishedOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "big.gguf")
	// About 1.5 GiB of F32 weights: seconds to write, so the interrupt
	// lands mid-way, once the temporary file exists.
	interruptWhileWriting(t, "inflate", out, "inflate", "--from", testutil.Model(t, "stories260K.gguf"),
		"--dims", "2048,8192,22,32,4,512", "--type", "f32", out)
}

// TestCtrlCRemovesUnfinishedCorpus interrupts corpus while it writes
// 2 GiB of stories: the text cut mid-story used to stay, as if whole.
func TestCtrlCRemovesUnfinishedCorpus(t *testing.T) {
	out := filepath.Join(t.TempDir(), "c.txt")
	interruptWhileWriting(t, "corpus", out, "corpus", "--size", "2GiB", out)
}

// interruptWhileWriting runs tandem with args and interrupts it once the
// temporary file it writes out through exists: it must exit 130, say it
// removed that file, and leave out's folder empty.
func interruptWhileWriting(t *testing.T, command, out string, args ...string) {
	t.Helper()
	code, _, stderr := interruptCLI(t, args, func(string, string) bool {
		tmps, _ := filepath.Glob(out + ".tmp*")
		return len(tmps) > 0
	})
	if want := "tandem " + command + ": interrupted (interrupt): removed 1 unfinished file(s)"; code != 130 || !strings.Contains(stderr, want) {
		t.Errorf("%s ended with %d, stderr %q; want 130 and %q", command, code, stderr, want)
	}
	if left, _ := os.ReadDir(filepath.Dir(out)); len(left) != 0 {
		t.Errorf("left after the interrupt: %v", left)
	}
}

// TestCtrlCRemovesAPlotsFolderItMade interrupts bench stream while it
// measures: the --plots folder it made for the plots goes too, where an
// empty one stayed.
func TestCtrlCRemovesAPlotsFolderItMade(t *testing.T) {
	plots := filepath.Join(t.TempDir(), "plots")
	args := []string{"bench", "stream", "--model", testutil.Model(t, "stories260K.gguf"), "--modes", "std", "--budgets", "50",
		"--storage", "1MB/s", "--runs", "1000", "--plots", plots}
	code, _, stderr := interruptCLI(t, args, func(string, string) bool {
		_, err := os.Stat(plots)
		return err == nil
	})
	if code != 130 || !strings.Contains(stderr, "interrupted") {
		t.Errorf("bench stream ended with %d, stderr %q; want 130", code, stderr)
	}
	if _, err := os.Stat(plots); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the plots folder stayed (%v)", err)
	}
}

// TestCtrlCEndsGenerateCleanly interrupts generate mid-text (its weights
// streamed from emulated 1 MB/s storage, so tokens come slowly): the text
// ends its line, stderr says interrupted, and the status is 130.
func TestCtrlCEndsGenerateCleanly(t *testing.T) {
	args := []string{"generate", "--model", testutil.Model(t, "stories260K.gguf"), "--max-tokens", "0",
		"--budget", "min", "--io-bandwidth", "1MB/s", "--prompt", "Once upon a time"}
	code, stdout, stderr := interruptCLI(t, args, func(out, _ string) bool { return len(out) > len("Once upon a time") })
	if code != 130 || !strings.HasSuffix(stderr, "tandem generate: interrupted\n") || !strings.HasSuffix(stdout, "\n") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 130, the text's line ended and a note", code, stdout, stderr)
	}
}

// TestCtrlCStopsSimulatedBenchSched interrupts bench sched's simulator
// runs, which read no context of their own: the command must stop at the
// next run with 130 and write no report.
func TestCtrlCStopsSimulatedBenchSched(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "report")
	args := []string{"bench", "sched", "--real=false", "--sim-costs", "300,30,5", "--sim-requests", "300", "--out", out,
		"--outcomes", filepath.Join(dir, "outcomes.jsonl")}
	start := time.Now()
	code, _, stderr := interruptCLI(t, args, func(string, string) bool { return time.Since(start) > 500*time.Millisecond })
	if code != 130 || !strings.HasSuffix(stderr, "tandem bench: interrupted\n") {
		t.Errorf("exit %d, stderr %q; want 130 and a note", code, stderr)
	}
	// Neither the folder it made for the report nor the outcomes' lines
	// so far (thousands, unfinished) stay.
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("an interrupted run left %v", left)
	}
}

// TestCtrlCStopsCalibrationTraining interrupts calibrate while it trains
// its regressor (after the generations): 130, and no calibration file.
func TestCtrlCStopsCalibrationTraining(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.calib.json")
	args := []string{"calibrate", "--model", testutil.Model(t, "stories260K.gguf"), "--n", "20", "--max-tokens", "8",
		"--epochs", "100000000", "--lanes", "1", "--out", out}
	code, _, stderr := interruptCLI(t, args, func(_, stderr string) bool { return strings.Contains(stderr, "training the estimator") })
	if code != 130 || !strings.HasSuffix(stderr, "tandem calibrate: interrupted\n") {
		t.Errorf("exit %d, stderr %q; want 130 and a note", code, stderr)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an interrupted calibration left %s (%v)", out, err)
	}
}
