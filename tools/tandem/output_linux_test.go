package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestOutputInAFolderNoOneMayWrite: an output in a folder the user may
// not write in is refused before the work, with the system's reason
// (permission denied, or a read-only file system). The folder is /sys,
// which refuses new files even to root (tests may run as root, for whom
// a folder's mode bits refuse nothing).
func TestOutputInAFolderNoOneMayWrite(t *testing.T) {
	err := checkOutput("--out", "/sys/c.json")
	if err == nil || !strings.Contains(err.Error(), "cannot write in /sys: ") {
		t.Fatalf("checkOutput in /sys: %v; want it refused, saying why", err)
	}
	code, out, errOut := tandem(t, "corpus", "--stories", "3", "/sys/c.txt")
	if code != 2 || out != "" || !strings.Contains(errOut, "cannot write in /sys") {
		t.Errorf("corpus into /sys: exit %d, stdout %q, stderr %q; want 2, saying it cannot write there", code, out, errOut)
	}
}

// TestBenchDirCheckedFirst: a benchmark's --dir is made when missing, and
// one it cannot make or write in is refused before any model is made
// (bench spec used to fail after inflating its first target).
func TestBenchDirCheckedFirst(t *testing.T) {
	made := filepath.Join(t.TempDir(), "a", "b")
	if err := keepDir(made); err != nil {
		t.Fatalf("keepDir(%s): %v", made, err)
	}
	if fi, err := os.Stat(made); err != nil || !fi.IsDir() {
		t.Errorf("%s not made: %v", made, err)
	}
	small := testutil.Model(t, "stories260K.bin")
	for _, args := range [][]string{
		{"bench", "decode", "--shape", "stories15m", "--types", "q4_0", "--dir", "/sys/tandem"},
		{"bench", "stream", "--from", small, "--shape", "stories15m", "--types", "q4_0", "--dir", "/sys/tandem"},
		{"bench", "spec", "--from", small, "--draft", testutil.Model(t, "llama2xs_model.bin"), "--prompts", testutil.Testdata(t, "stories260K.greedy.jsonl"), "--shape", "stories15m", "--dir", "/sys/tandem"},
	} {
		code, out, errOut := tandem(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "--dir /sys/tandem") || strings.Contains(errOut, "inflate") || strings.Contains(errOut, "synth") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 naming --dir before any model is made", args, code, out, errOut)
		}
	}
}
