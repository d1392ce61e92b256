package bench

import (
	"strings"
	"testing"

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
