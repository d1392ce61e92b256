package bench

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/spec"
)

// TestSpecModesShape: the tree modes take the tree's shape from the
// flags, the fixed-size ablation verifies at its cap, and zero fields
// leave spec's defaults.
func TestSpecModesShape(t *testing.T) {
	shape := spec.Config{BranchThreshold: 0.05, MaxBranches: 32, MaxTree: 64}
	seen := 0
	for _, m := range SpecModes(6, shape) {
		if !strings.HasPrefix(m.Name, "tree") {
			continue
		}
		seen++
		c := m.Config
		if c.BranchThreshold != 0.05 || c.MaxBranches != 32 || c.MaxTree != 64 {
			t.Errorf("%s: threshold %g, branches %d, tree %d; want the shape's", m.Name, c.BranchThreshold, c.MaxBranches, c.MaxTree)
		}
		if m.Name == "tree-fixed" && c.Trigger != (spec.FixedSize{N: 64}) {
			t.Errorf("tree-fixed trigger %#v, want FixedSize{64}", c.Trigger)
		}
	}
	if seen != 5 {
		t.Errorf("%d tree modes, want tree and its 4 ablations", seen)
	}
	for _, m := range SpecModes(6, spec.Config{}) {
		if m.Name == "tree-fixed" && m.Config.Trigger != (spec.FixedSize{N: spec.DefaultMaxTree}) {
			t.Errorf("default tree-fixed trigger %#v, want FixedSize{%d}", m.Config.Trigger, spec.DefaultMaxTree)
		}
	}
}

// TestSpecCountsTheTokensItKeeps: a speculative run that asks for fewer
// tokens than its passes accept counts only those it kept, so tokens per
// pass never exceed the tokens generated (with 2 tokens a run, sd with a
// draft of 8 read 9 tokens a pass).
func TestSpecCountsTheTokensItKeeps(t *testing.T) {
	target, draft := testutil.Model(t, "stories260K.gguf"), testutil.Model(t, "llama2xs_model.bin")
	for _, m := range SpecModes(8, spec.Config{}) {
		if m.Name != "sd(k=8)" && m.Name != "tree" {
			continue
		}
		const runs, tokens = 2, 2
		r, err := Spec(SpecConfig{Target: target, Draft: draft, Mode: m, Budget: 1 << 30, Threads: 1,
			Prompts: [][]int32{{1, 403, 407}}, Runs: runs, Tokens: tokens})
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if r.Emitted != runs*tokens || r.Passes < runs || r.TokensPerPass() > tokens {
			t.Errorf("%s: %d tokens over %d passes (%.2f a pass); the runs kept %d", m.Name, r.Emitted, r.Passes, r.TokensPerPass(), runs*tokens)
		}
	}
}

// Lossless holds every lossless mode's every token to the target alone's,
// in every run, and Agreement counts over all of a mode's tokens: a
// difference after the first few tokens, or past the reference's end,
// is found.
func TestLosslessChecksEveryToken(t *testing.T) {
	ref := [][]int32{{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}}
	result := func(mode string, outs ...[]int32) SpecResult {
		return SpecResult{Config: SpecConfig{Mode: SpecMode{Name: mode}}, Type: "q4_0", Outputs: outs}
	}
	ok := []SpecResult{
		result("std", []int32{1, 2}, []int32{7, 8}),
		result("tree", []int32{1, 2, 3, 4, 5, 6}, []int32{7, 8, 9, 10, 11, 12}),
		result("bild", []int32{1, 2, 3, 4, 5, 0}, []int32{7, 8, 9, 10, 11, 12}), // lossy by design
	}
	if err := Lossless(ok, ref); err != nil {
		t.Fatal(err)
	}
	if a := Agreement(ok[2].Outputs, ref); a != 11.0/12 {
		t.Errorf("bild's agreement %v, want 11/12", a)
	}
	for _, bad := range []SpecResult{
		result("tree", []int32{1, 2, 3, 4, 5, 6}, []int32{7, 8, 9, 10, 11, 0}), // the last token of run 1
		result("sd(k=4)", []int32{1, 2, 3, 4, 5, 6, 7}),                        // past the reference
		result("tree", []int32{1}, []int32{7}, []int32{1}),                     // a run the reference lacks
	} {
		if err := Lossless([]SpecResult{bad}, ref); err == nil {
			t.Errorf("%s %v passed", bad.Config.Mode.Name, bad.Outputs)
		}
		if a := Agreement(bad.Outputs, ref); a == 1 {
			t.Errorf("%s %v agrees fully", bad.Config.Mode.Name, bad.Outputs)
		}
	}
}
