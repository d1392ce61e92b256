package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestBenchSpecSmall runs the speculative benchmark end to end on a small
// inflated target (512 wide, 6 layers) and checks that it reports every
// mode asked for, the goals, both curves, the draft's ranks with the
// best tree they allow, and writes its plot into a folder it has to
// create.
func TestBenchSpecSmall(t *testing.T) {
	plots := filepath.Join(t.TempDir(), "results", "spec")
	code, out, errOut := tandem(t, "bench", "spec", "--from", testutil.Model(t, "stories260K.bin"),
		"--draft", testutil.Model(t, "llama2xs_model.bin"), "--prompts", testutil.Testdata(t, "stories260K.greedy.jsonl"),
		"--shape", "512,1536,6,16,8,512", "--types", "q4_0", "--budgets", "50", "--storage", "400MB/s",
		"--modes", "std,sd,tree", "--sd-lens", "2,4", "--runs", "1", "--tokens", "6", "--std-tokens", "2", "--plots", plots)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"| std |", "| sd(k=", "| tree |", "goal 5x", "verification cost by tree size", "tree acceptance by depth",
		"draft rank of the target's token (share of the 6 positions", "best tree for these ranks", "measured: tree "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(plots, "spec-q4_0-50.svg")); err != nil {
		t.Errorf("plot: %v", err)
	}
	// Every row's tokens were checked against the target alone's, all 6
	// of the speculative ones (not the 2 std ran), without stdpl.
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| Q4_0 |") {
			rows++
			if !strings.HasSuffix(line, "| 1.000 |") {
				t.Errorf("a row without full agreement: %s", line)
			}
		}
	}
	if rows != 3 {
		t.Errorf("%d rows for std, sd and tree:\n%s", rows, out)
	}
}

// TestBenchStreamSmall does the same for the streaming benchmark.
func TestBenchStreamSmall(t *testing.T) {
	plots := filepath.Join(t.TempDir(), "results", "stream")
	code, out, errOut := tandem(t, "bench", "stream", "--from", testutil.Model(t, "stories260K.bin"),
		"--shape", "512,1536,6,16,8,512", "--types", "q4_0", "--budgets", "50", "--storage", "400MB/s",
		"--modes", "resident,stdpl", "--runs", "1", "--tokens", "2", "--plots", plots)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"resident", "stdpl"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(plots, "stream-q4_0.svg")); err != nil {
		t.Errorf("plot: %v", err)
	}
}

// TestBenchSpecTreeFlags: a tree shape that cannot work is a usage error
// before any model is inflated.
func TestBenchSpecTreeFlags(t *testing.T) {
	for _, bad := range [][]string{{"--max-tree", "0"}, {"--max-branches", "0"}, {"--branch-threshold", "1"}, {"--branch-threshold", "0"}, {"--max-tree", "5000"}} {
		args := append([]string{"bench", "spec", "--from", "a.bin", "--draft", "b.bin", "--prompts", "p.jsonl"}, bad...)
		if code, _, errOut := tandem(t, args...); code != 2 || !strings.Contains(errOut, bad[0]) {
			t.Errorf("%v: exit %d, %q; want a usage error naming the flag", bad, code, errOut)
		}
	}
}
