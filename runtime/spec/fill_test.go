package spec

import (
	"context"
	"slices"
	"testing"
)

// TestTreeFill: a verification's free rows take the candidates most
// likely accepted, pruned nodes and alternatives alike, ranked by
// calibrated C; alternatives join the tree as pruned children (the draft
// still does not extend them), and nothing is picked twice.
//
//	root ─ 1:a(0.6) ─ 4:a1(0.5)   alternatives of a: x(0.2), y(0.05)
//	     ├ 2:b(0.3)
//	     └ 3:p(0.0001) pruned      alternatives of root: z(0.1)
//
// Uncalibrated scores: x 0.12, z 0.1, y 0.03, p 0.0001. Halving depth 2
// makes z (0.1) beat x (0.06).
func TestTreeFill(t *testing.T) {
	build := func() *tree {
		tr := handTree([][3]float64{{0, 1, 0.6}, {0, 2, 0.3}, {0, 3, 0.0001}, {1, 4, 0.5}})
		tr.nodes[3].pruned = true
		tr.nodes[0].alts = []alt{{tok: 26, prob: 0.1}, {tok: 3, prob: 0.0001}} // 3 is p, a child already
		tr.nodes[1].alts = []alt{{tok: 24, prob: 0.2}, {tok: 25, prob: 0.05}}
		return tr
	}
	flat := func(int) float64 { return 1 }
	for _, tc := range []struct {
		name   string
		room   int
		factor func(int) float64
		want   []int32 // tokens picked
		added  int     // of them, alternatives that became nodes
	}{
		{"one row", 1, flat, []int32{24}, 1},
		{"calibrated", 1, func(d int) float64 { return map[bool]float64{true: 0.5, false: 1}[d == 2] }, []int32{26}, 1},
		{"every candidate", 10, flat, []int32{24, 26, 25, 3}, 3},
		{"no room", 0, flat, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := build()
			before := len(tr.nodes)
			marks, n := tr.fill(tc.room, tc.factor)
			if n != len(tc.want) {
				t.Fatalf("filled %d rows, want %d", n, len(tc.want))
			}
			var got []int32
			for i, m := range marks {
				if !m {
					continue
				}
				nd := tr.nodes[i]
				if !nd.pruned || nd.expanded || tr.nodes[nd.parent].pruned {
					t.Errorf("node %d (token %d): pruned %v, expanded %v, parent pruned %v; want a pruned leaf under a checked node",
						i, nd.tok, nd.pruned, nd.expanded, tr.nodes[nd.parent].pruned)
				}
				if want := tr.nodes[nd.parent].conf * float64(nd.prob); nd.conf != want {
					t.Errorf("node %d: C %g, want %g", i, nd.conf, want)
				}
				got = append(got, nd.tok)
			}
			if !sameSet(got, tc.want) {
				t.Errorf("filled tokens %v, want %v", got, tc.want)
			}
			if added := len(tr.nodes) - before; added != tc.added {
				t.Errorf("%d nodes added, want %d (one per alternative picked)", added, tc.added)
			}
			for i := range tr.nodes {
				if i < before && i != 3 && i < len(marks) && marks[i] {
					t.Errorf("node %d, already checked, marked again", i)
				}
			}
			// A second fill finds the first one's picks as pruned nodes,
			// not as alternatives again: no token gets two nodes.
			tr.fill(10, flat)
			for i := range tr.nodes {
				toks := map[int32]bool{}
				for _, c := range tr.nodes[i].children {
					if toks[tr.nodes[c].tok] {
						t.Fatalf("node %d has two children with token %d", i, tr.nodes[c].tok)
					}
					toks[tr.nodes[c].tok] = true
				}
			}
		})
	}
}

func sameSet(a, b []int32) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// fixedFill verifies at a fixed tree size and offers free rows, as a
// streamed target's CostAware does, so tests fill whatever the storage.
type fixedFill struct {
	FixedSize
	rows int
}

func (f fixedFill) FreeRows() int         { return f.rows }
func (fixedFill) DepthFactor(int) float64 { return 1 }

// TestFillChecksFreeRows: filling free rows keeps greedy output exactly
// the target's, and on the shared pair its checked alternatives are
// accepted often enough to save target passes over every record.
func TestFillChecksFreeRows(t *testing.T) {
	recs := arRecords(t, "stories260K.greedy.jsonl")
	if raceEnabled || testing.Short() {
		recs = recs[:2]
	}
	p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", false)
	var stats []Stats
	for _, trig := range []Trigger{FixedSize{N: 8}, fixedFill{FixedSize{N: 8}, 40}} {
		d := p.decoder(t, Config{Method: Tree, Trigger: trig})
		for i, r := range recs {
			if got := speculateRecord(t, d, r); !slices.Equal(got, r.GeneratedIDs) {
				t.Fatalf("%T record %d:\n got %v\nwant %v", trig, i, got, r.GeneratedIDs)
			}
		}
		st := d.Stats()
		t.Logf("%T: %d target passes, %d tokens verified, %d in free rows, %d of them accepted", trig, st.TargetPasses, st.Verified, st.Filled, st.FilledAccepted)
		stats = append(stats, st)
	}
	plain, filled := stats[0], stats[1]
	if plain.Filled != 0 {
		t.Errorf("a trigger without free rows filled %d", plain.Filled)
	}
	if filled.Filled == 0 || filled.FilledAccepted == 0 {
		t.Fatalf("free rows: %d tokens checked, %d accepted; want both above 0", filled.Filled, filled.FilledAccepted)
	}
	if filled.TargetPasses >= plain.TargetPasses {
		t.Errorf("%d target passes with free rows filled, %d without: filling saved none", filled.TargetPasses, plain.TargetPasses)
	}
}

// TestAlternativesOnlyWithRowsToFill: the draft keeps a node's
// alternatives only while verifications have free rows, so a resident
// target (CostAware offers none) pays nothing for them.
func TestAlternativesOnlyWithRowsToFill(t *testing.T) {
	r := arRecords(t, "stories260K.greedy.jsonl")[0]
	p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", false)
	for _, tc := range []struct {
		trig Trigger
		want bool
	}{{nil, false}, {fixedFill{FixedSize{N: 8}, 40}, true}} {
		d := p.decoder(t, Config{Method: Tree, Trigger: tc.trig})
		ctx := context.Background()
		if err := d.Start(ctx, r.PromptIDs, 0); err != nil {
			t.Fatal(err)
		}
		alts := 0
		for range 4 {
			if _, err := d.Step(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := d.draftStep(d.cfg.MaxTree); err != nil {
				t.Fatal(err)
			}
			for _, n := range d.tree.nodes {
				alts += len(n.alts)
			}
		}
		d.Close()
		if (alts > 0) != tc.want {
			t.Errorf("trigger %T: %d alternatives kept, want some: %v", tc.trig, alts, tc.want)
		}
	}
}
