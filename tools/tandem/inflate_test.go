package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestInflateThenGenerate inflates stories260K through the CLI and checks
// the large model writes the same greedy text as the source.
func TestInflateThenGenerate(t *testing.T) {
	src := testutil.Model(t, "stories260K.bin")
	tok := testutil.Model(t, "tok512.bin")
	out := filepath.Join(t.TempDir(), "big.gguf")
	code, stdout, errOut := tandem(t, "inflate", "--from", src, "--tokenizer", tok, "--dims", "256,512,6,8,4,1", "--type", "f32", out)
	if code != 0 || !strings.Contains(stdout, "wrote") {
		t.Fatalf("inflate: exit %d\n%s%s", code, stdout, errOut)
	}
	gen := func(args ...string) string {
		t.Helper()
		code, stdout, errOut := tandem(t, append([]string{"generate", "--json", "--max-tokens", "40"}, args...)...)
		if code != 0 {
			t.Fatalf("generate %v: exit %d: %s", args, code, errOut)
		}
		var r struct{ Text string }
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatal(err)
		}
		return r.Text
	}
	want := gen("--model", src, "--tokenizer", tok)
	// The inflated model carries the vocabulary: no --tokenizer.
	if got := gen("--model", out); got != want {
		t.Errorf("inflated model wrote %q, source %q", got, want)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inflate", "--shape", "stories110m", out}, "--from"},
		{[]string{"inflate", "--from", src, out}, "--shape or --dims"},
		{[]string{"inflate", "--from", src, "--shape", "nope", out}, "unknown shape"},
		{[]string{"inflate", "--from", src, "--dims", "32,64,1,4,4,1", out}, "width 32 is below the source's 64"},
		{[]string{"inflate", "--from", src, "--shape", "stories110m", "--type", "q6_k", out}, "cannot write"},
	} {
		if code, _, errOut := tandem(t, tc.args...); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want an error saying %q", tc.args, code, errOut, tc.want)
		}
	}
}
