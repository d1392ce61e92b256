package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestOutputCheckedBeforeWork gives each command that writes a file an
// output it cannot write: a directory, or a file in a missing directory.
// Each must refuse at once (exit 2, naming the path), not after its work,
// and leave nothing behind.
func TestOutputCheckedBeforeWork(t *testing.T) {
	gguf := testutil.Model(t, "stories260K.gguf")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "out.gguf")
	text := filepath.Join(dir, "c.txt")
	if err := os.WriteFile(text, []byte("Once upon a time there was a cat.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{dir, missing} {
		cmds := [][]string{
			{"convert", gguf, out},
			{"inflate", "--from", gguf, "--dims", "128,384,6,8,4,512", out},
			{"synth", "--shape", "tinyllama-1.1b", out},
			{"calibrate", "--model", gguf, "--out", out},
			{"corpus", "--stories", "3", out},
		}
		if out == dir { // train and distill make a missing folder
			cmds = append(cmds, []string{"train", "--data", text, "--vocab", gguf, "--out", out},
				[]string{"distill", "--target", gguf, "--out", out})
		}
		for _, args := range cmds {
			code, _, errOut := tandem(t, args...)
			if code != 2 || !strings.Contains(errOut, out) {
				t.Errorf("%v: exit %d, %q; want 2 and the path named", args, code, errOut)
			}
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("left behind: %v", left)
	}
}

// TestOutputThatMustNotBeReplaced: an output that exists read-only, or
// that is the command's own input, is refused before any work and left
// as it was. Renaming over either succeeds (root even in a read-only
// folder): convert once replaced a read-only model with itself.
func TestOutputThatMustNotBeReplaced(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "in.gguf") // a copy: a failing test must not write the shared file
	data, err := os.ReadFile(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gguf, data, 0o644); err != nil {
		t.Fatal(err)
	}
	readOnly := filepath.Join(dir, "kept.gguf")
	if err := os.WriteFile(readOnly, []byte("keep me"), 0o444); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "c.txt")
	story := "Once upon a time there was a cat. It sat in the sun all day.\n"
	if err := os.WriteFile(text, []byte(story), 0o644); err != nil {
		t.Fatal(err)
	}
	shape := []string{"--shape", "32,64,2,4,2,64", "--steps", "2"}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"convert", gguf, gguf}, "is the input"},
		// Each of these replaced its input with the model or vocabulary
		// it wrote, and said nothing.
		{append([]string{"train", "--data", text, "--vocab", gguf, "--out", text}, shape...), "is the input"},
		{append([]string{"train", "--data", text, "--vocab", gguf, "--out", filepath.Join(dir, "m.gguf"), "--ckpt", gguf}, shape...), "is the input"},
		{append([]string{"train", "--data", text, "--vocab", gguf, "--out", filepath.Join(dir, "m.gguf"), "--ckpt", dir}, shape...), "is a directory"},
		{append([]string{"train", "--data", text, "--vocab", gguf, "--out", filepath.Join(dir, "m.gguf"), "--ckpt", filepath.Join(dir, "m.gguf")}, shape...), "is --out"},
		{[]string{"distill", "--target", gguf, "--out", filepath.Join(dir, "d.gguf"), "--ckpt", gguf, "--steps", "1"}, "is the input"},
		{[]string{"corpus", "--from", text, "--vocab", "300", "--vocab-out", text}, "is the text"},
		{[]string{"corpus", "--stories", "3", "--vocab", "300", "--vocab-out", filepath.Join(dir, "s.txt"), filepath.Join(dir, "s.txt")}, "is the text"},
		{[]string{"corpus", "--stories", "3", "--vocab", "300", "--vocab-out", dir, filepath.Join(dir, "s.txt")}, "is a directory"},
		{[]string{"synth", "--dims", "64,172,4,8,4,512", "--vocab", gguf, gguf}, "is the input"},
		{[]string{"inflate", "--from", gguf, "--dims", "128,384,6,8,4,512", gguf}, "is the input"},
		{[]string{"convert", gguf, readOnly}, "read-only"},
		{[]string{"inflate", "--from", gguf, "--dims", "128,384,6,8,4,512", readOnly}, "read-only"},
		{[]string{"synth", "--shape", "stories15m", readOnly}, "read-only"},
		{[]string{"calibrate", "--model", gguf, "--out", readOnly}, "read-only"},
		{[]string{"corpus", "--stories", "3", readOnly}, "read-only"},
		{[]string{"distill", "--target", gguf, "--out", readOnly}, "read-only"},
	} {
		code, _, errOut := tandem(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%v: exit %d, %q; want 2, saying it %s", tc.args, code, errOut, tc.says)
		}
	}
	if b, _ := os.ReadFile(gguf); string(b) != string(data) {
		t.Error("the input was replaced")
	}
	if b, _ := os.ReadFile(text); string(b) != story {
		t.Error("the training text was replaced")
	}
	if _, err := os.Stat(filepath.Join(dir, "s.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("corpus wrote its text before finding its vocabulary's path wrong (%v)", err)
	}
	if b, _ := os.ReadFile(readOnly); string(b) != "keep me" {
		t.Error("the read-only file was replaced")
	}
	// A vocabulary-only GGUF has nothing to convert.
	code, _, errOut := tandem(t, "convert", testutil.Model(t, "ggml-vocab-llama-spm.gguf"), filepath.Join(dir, "v.gguf"))
	if code != 1 || !strings.Contains(errOut, "no tensors") {
		t.Errorf("convert of a vocabulary: exit %d, %q; want 1, saying it has no tensors", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "v.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("v.gguf written (%v)", err)
	}
}

// TestCorpusRefusesANegativeVocabularyFirst: the text is not written when
// the vocabulary asked for cannot be made.
func TestCorpusRefusesANegativeVocabularyFirst(t *testing.T) {
	out := filepath.Join(t.TempDir(), "c.txt")
	if code, _, errOut := tandem(t, "corpus", "--stories", "3", "--vocab", "-1", out); code != 2 || !strings.Contains(errOut, "--vocab") {
		t.Errorf("exit %d, %q; want 2 and --vocab named", code, errOut)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s written (%v)", out, err)
	}
}

// TestBenchOutputDirectoryWritable: bench sched's --out must be a
// directory it can write in, checked before the runs.
func TestBenchOutputDirectoryWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "300,30,5", "--out", file)
	if code == 0 || out != "" {
		t.Errorf("--out naming a file: exit %d, stdout %q, stderr %q; want a failure before the runs", code, out, errOut)
	}
}

// TestPercentFlagsRefuseNaN: every flag that takes a share of the
// weights refuses NaN% (it read as a budget of 8 EiB).
func TestPercentFlagsRefuseNaN(t *testing.T) {
	bin := testutil.Model(t, "stories260K.bin")
	tok := testutil.Model(t, "tok512.bin")
	for _, args := range [][]string{
		{"generate", "--model", bin, "--tokenizer", tok, "--budget", "NaN%", "--max-tokens", "1"},
		{"bench", "stream", "--from", bin, "--budgets", "NaN"},
		{"bench", "spec", "--from", bin, "--draft", bin, "--prompts", tok, "--budgets", "nan%"},
	} {
		if code, _, errOut := tandem(t, args...); code != 2 || !strings.Contains(strings.ToLower(errOut), "nan") {
			t.Errorf("%v: exit %d, %q; want 2 and the value named", args, code, errOut)
		}
	}
}

// TestBenchCountsAndModesChecked: run counts below 1 and unknown modes
// are usage errors, not an empty report.
func TestBenchCountsAndModesChecked(t *testing.T) {
	bin := testutil.Model(t, "stories260K.bin")
	prompts := filepath.Join(t.TempDir(), "p.txt")
	if err := os.WriteFile(prompts, []byte("Once upon a time\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"bench", "spec", "--from", bin, "--draft", bin, "--prompts", prompts, "--modes", "bogus"},
		{"bench", "spec", "--from", bin, "--draft", bin, "--prompts", prompts, "--runs", "0"},
		{"bench", "spec", "--from", bin, "--draft", bin, "--prompts", prompts, "--tokens", "-1"},
		{"bench", "stream", "--from", bin, "--runs", "-2"},
		{"bench", "stream", "--from", bin, "--tokens", "-3"},
		{"eval", "--model", bin, "--prompts", prompts, "--gen", "-1"},
	} {
		if code, _, errOut := tandem(t, args...); code != 2 {
			t.Errorf("%v: exit %d, %q; want 2", args, code, errOut)
		}
	}
}

// TestGeneratePromptOverTheContext: a prompt the context cannot hold is a
// usage error that says what to change, before the prompt is echoed.
func TestGeneratePromptOverTheContext(t *testing.T) {
	bin, tok := testutil.Model(t, "stories260K.bin"), testutil.Model(t, "tok512.bin")
	long := strings.Repeat("once upon a time ", 200)
	code, out, errOut := tandem(t, "generate", "--model", bin, "--tokenizer", tok, "--prompt", long, "--ctx", "256")
	if code != 2 || out != "" || !strings.Contains(errOut, "raise --ctx (the model takes up to 512)") {
		t.Errorf("exit %d, stdout %d bytes, stderr %q; want 2, nothing echoed and --ctx suggested", code, len(out), errOut)
	}
}

// failingWriter is a full disk.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestLostOutputFails: a command whose report cannot be written exits 1
// and says so, though it printed without checking each write.
func TestLostOutputFails(t *testing.T) {
	gguf := testutil.Model(t, "stories260K.gguf")
	for _, args := range [][]string{{"version"}, {"inspect", gguf}, {"tokenize", "--model", gguf, "Once upon a time"}} {
		var errb strings.Builder
		if code := run(args, failingWriter{}, &errb); code != 1 || !strings.Contains(errb.String(), "writing the output: no space left") {
			t.Errorf("%v to a full disk: exit %d, %q; want 1 and the write error", args, code, errb.String())
		}
	}
}
