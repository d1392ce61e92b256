package bench

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// TestStreamBench runs the streaming benchmark on a small inflated model
// in every mode: the modes decode the same tokens, the streamer stays in
// its budget, a streamed run reads what the plan says per token and is no
// faster than its emulated IO bound allows, and the table and plot carry
// every configuration.
func TestStreamBench(t *testing.T) {
	src, err := weights.Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "t.gguf")
	sh := weights.Shape{Name: "small", Dim: 128, Hidden: 384, Layers: 6, Heads: 8, KVHeads: 4}
	if err := weights.Inflate(src, path, weights.InflateOptions{Shape: sh, Type: weights.Q8_0}); err != nil {
		t.Fatal(err)
	}
	disk, err := DiskBandwidth(path, 1<<30)
	if err != nil {
		t.Skipf("no page cache control here: %v", err)
	}
	var rs []StreamResult
	for _, cfg := range []StreamConfig{
		{Mode: "resident"},
		{Mode: "std", Budget: 600 << 10, Bandwidth: 100e6},
		{Mode: "stdpl", Budget: 600 << 10, Bandwidth: 100e6},
		{Mode: "stdpl", Budget: 600 << 10},
	} {
		cfg.Runs, cfg.Tokens, cfg.Threads, cfg.DiskBW = 2, 2, 1, disk
		r, err := Stream(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Mode != "resident" {
			if r.PeakResident > cfg.Budget {
				t.Errorf("%s: peak resident %d > budget %d", cfg.Mode, r.PeakResident, cfg.Budget)
			}
			if r.Streamed == 0 || r.Read < r.Streamed {
				t.Errorf("%s: read %d bytes per token, plan says %d", cfg.Mode, r.Read, r.Streamed)
			}
			// Over a run, reads of the emulated device cannot beat its
			// bandwidth by more than the window read ahead.
			if cfg.Bandwidth > 0 && r.Token < r.Bound/2 {
				t.Errorf("%s: %v per token beats the IO bound %v", cfg.Mode, r.Token, r.Bound)
			}
		}
		rs = append(rs, r)
	}
	if err := SameTokens(rs); err != nil {
		t.Fatal(err)
	}
	if len(rs[0].Tokens) != 2+2*2 {
		t.Errorf("%d tokens decoded, want 6", len(rs[0].Tokens))
	}
	table := StreamTable(rs)
	if n := strings.Count(table, "\n"); n != 2+len(rs) {
		t.Errorf("table has %d lines, want %d:\n%s", n, 2+len(rs), table)
	}
	if !strings.Contains(StreamGoals(rs), "stdpl") {
		t.Errorf("goals: %q", StreamGoals(rs))
	}
	if svg := string(StreamPlot(rs, "t")); strings.Count(svg, "<polyline") != 6 { // std, stdpl, bound at 100 MB/s; stdpl, bound on disk; resident
		t.Errorf("plot has %d lines", strings.Count(svg, "<polyline"))
	}
	bad := rs[1]
	bad.Tokens = append([]int32(nil), bad.Tokens...)
	bad.Tokens[3]++
	if SameTokens([]StreamResult{rs[0], bad}) == nil {
		t.Error("SameTokens missed a differing token")
	}
}
