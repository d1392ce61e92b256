package bench

import (
	"math"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestBestTrees checks the dynamic program on trees worked out by hand:
// a draft that is always right grows a chain; an even split at rank 1
// and 2 branches; a strong rank 1 grows deep before it grows wide.
func TestBestTrees(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ranks []float64
		want  []float64 // tokens per pass for 0, 1, 2, ... nodes
	}{
		{"always right", []float64{1}, []float64{1, 2, 3, 4}},
		// 2 nodes: both children (0.5+0.5) beat a chain (0.5·1.5);
		// 3 nodes: both children and one grandchild (0.5·1.5+0.5).
		{"even split", []float64{0.5, 0.5}, []float64{1, 1.5, 2, 2.25}},
		// 2 nodes: a chain (0.6·1.6 = 0.96) beats both children (0.9);
		// 3 nodes: rank 1 with a child, and rank 2 (0.6·1.6+0.3 =
		// 1.26), beat a chain (0.6·1.96 = 1.176) and rank 1 with both
		// children (0.6·1.9 = 1.14).
		{"strong first", []float64{0.6, 0.3}, []float64{1, 1.6, 1.96, 2.26}},
		{"never right", []float64{0, 0}, []float64{1, 1, 1}},
	} {
		got := BestTrees(tc.ranks, len(tc.want)-1)
		for n := range tc.want {
			if math.Abs(got[n]-tc.want[n]) > 1e-12 {
				t.Errorf("%s: %d nodes: %.4f tokens/pass, want %.4f", tc.name, n, got[n], tc.want[n])
			}
		}
	}
	// More nodes never hurt, and a tree never beats its size plus one.
	got := BestTrees([]float64{0.67, 0.16, 0.04, 0.03}, 128)
	for n := 1; n < len(got); n++ {
		if got[n] < got[n-1] || got[n] > float64(n+1) {
			t.Fatalf("%d nodes: %.3f tokens/pass after %.3f", n, got[n], got[n-1])
		}
	}
}

// TestDraftRanks: a model ranks its own greedy continuation first at
// every position; a different draft does not.
func TestDraftRanks(t *testing.T) {
	recs := testutil.GreedyRecords(t, "stories260K.greedy.jsonl")
	var prompts, outputs [][]int32
	for _, r := range recs {
		prompts = append(prompts, r.PromptIDs)
		outputs = append(outputs, r.GeneratedIDs[:24])
	}
	self, n, err := DraftRanks(testutil.Model(t, "stories260K.bin"), 1, prompts, outputs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if n != 24*len(recs) || self[0] != 1 {
		t.Errorf("target as its own draft: %d positions, rank 1 at %.3f of them; want %d and all", n, self[0], 24*len(recs))
	}
	other, _, err := DraftRanks(testutil.Model(t, "llama2xs_model.bin"), 1, prompts, outputs, 4)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, v := range other {
		sum += v
	}
	if other[0] >= 1 || other[0] <= other[1] || sum > 1 {
		t.Errorf("llama2xs ranks %v: want rank 1 most often but not always, shares summing to at most 1", other)
	}
	if _, _, err := DraftRanks(testutil.Model(t, "llama2xs_model.bin"), 1, prompts, outputs[:1], 4); err == nil {
		t.Error("mismatched prompts and outputs: no error")
	}
}
