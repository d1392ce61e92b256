package main

import (
	"strings"
	"testing"
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
