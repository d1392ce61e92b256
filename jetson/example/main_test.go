package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// TestPlanner runs the planner briefly on the embedded model: every step
// arrives as a segment, executes, and the parked sequence resumes.
func TestPlanner(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"--steps", "3", "--execute", "1ms", "--max-step-chars", "40", "--threads", "1"}, &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{"step 1:", "executing step 1", "step 3:", "plan stopped after 3 steps",
		"scheduler: 3 admitted, 3 segments", "lane cpu0: 1 threads", "0 sequences held"} { // the submit and two resumes
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestPlannerPinned: --cpus pins the planner's lane, and says where.
func TestPlannerPinned(t *testing.T) {
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	pin := cpuset.Set{allowed[len(allowed)-1]}
	var out bytes.Buffer
	err = run(context.Background(), []string{"--steps", "2", "--execute", "1ms", "--max-step-chars", "40", "--threads", "1", "--cpus", pin.String()}, &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if want := "lane cpu0: 1 threads on CPUs " + pin.String(); !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

// TestPlannerEnds: a plan whose token budget runs out ends with its
// reason instead of waiting for a step that never comes.
func TestPlannerEnds(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"--model", testutil.Model(t, "stories260K.gguf"), "--goal", "Once upon a time",
		"--max-tokens", "5", "--max-step-chars", "1000", "--execute", "0s", "--threads", "1"}, &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "plan ended: length after 5 tokens") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestPlannerErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--steps", "0"}, "at least 1"},
		{[]string{"--deadline", "0s"}, "--deadline"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--cpus", "1-0"}, "--cpus"},
		{[]string{"--cpus", "0", "--threads", "2"}, "take turns"},
		{[]string{"--model", "/nowhere/model.gguf"}, "/nowhere/model.gguf"},
		{[]string{"--model", testutil.Model(t, "llama2xs_model.bin")}, "pass --tokenizer"},
		{[]string{"--model", testutil.Model(t, "stories260K.gguf"), "--tokenizer", testutil.Model(t, "tokenizer.bin")}, "pass the model's own with --tokenizer"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "robot planner") {
		t.Errorf("--help: %v\n%s", err, out.String())
	}
}

// TestEstimator: the embedded model plans with the calibration it ships
// with; a model file with the one beside it, or with none (prompt
// length); a damaged one is an error, not a silent fallback.
func TestEstimator(t *testing.T) {
	est, err := estimator("")
	if err != nil || !est.Calibrated() {
		t.Fatalf("embedded model: calibrated %v, %v", est.Calibrated(), err)
	}
	model := filepath.Join(t.TempDir(), "model.gguf")
	if est, err := estimator(model); err != nil || est.Calibrated() {
		t.Errorf("a model without calibration: calibrated %v, %v", est.Calibrated(), err)
	}
	os.WriteFile(sched.CalibrationPath(model), []byte("{"), 0o644)
	if _, err := estimator(model); err == nil {
		t.Error("a damaged calibration beside the model was ignored")
	}
}
