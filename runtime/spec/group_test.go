package spec

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// TestGroupStep: three decoders sharing a draft/target pair and its
// caches step as a Group, every round's trees verified in one target
// pass, and each emits exactly the target's reference tokens: resident,
// and streamed with the IO pipeline, where the target's passes over its
// weights are one per round of the group, fewer than the trees verified.
func TestGroupStep(t *testing.T) {
	const n = 40
	recs := arRecords(t, "stories260K.greedy.jsonl")[:3]
	for i, r := range recs {
		if j := slices.Index(r.GeneratedIDs, 1); j >= 0 {
			r.GeneratedIDs = r.GeneratedIDs[:j]
		}
		if len(r.GeneratedIDs) < n {
			t.Fatalf("record %d has %d tokens before BOS, want %d", i, len(r.GeneratedIDs), n)
		}
		recs[i].GeneratedIDs = r.GeneratedIDs[:n]
	}
	for _, stream := range []bool{false, true} {
		p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", stream)
		cfg := Config{Method: Tree, Pipeline: stream, Lane: p.lane}
		newCache := func(m *model.Model) *kv.Cache {
			c, err := m.NewTreeCache(specContext, cfg.TreeRows(), 0)
			if err != nil {
				t.Fatal(err)
			}
			kc := c.Config()
			kc.MaxSeqs = len(recs)
			if c, err = kv.New(kc); err != nil {
				t.Fatal(err)
			}
			return c
		}
		dcache, tcache := newCache(p.draft), newCache(p.target)
		var decs []*Decoder
		for _, r := range recs {
			d, err := New(p.draft, p.target, dcache, tcache, nil, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Start(context.Background(), r.PromptIDs, 0); err != nil {
				t.Fatal(err)
			}
			decs = append(decs, d)
		}
		passes0 := targetPasses(p.target)
		var g Group
		got := make([][]int32, len(decs))
		out, errs := make([][]int32, len(decs)), make([]error, len(decs))
		rounds := 0
		for {
			var active []*Decoder
			var which []int
			for i, d := range decs {
				if len(got[i]) < n {
					active, which = append(active, d), append(which, i)
				}
			}
			if len(active) == 0 {
				break
			}
			g.Step(context.Background(), active, out, errs)
			rounds++
			for k, i := range which {
				if errs[k] != nil {
					t.Fatalf("stream %v: decoder %d: %v", stream, i, errs[k])
				}
				got[i] = append(got[i], out[k]...)
			}
		}
		trees, steps := 0, 0
		for i, d := range decs {
			if !slices.Equal(got[i][:n], recs[i].GeneratedIDs) {
				t.Errorf("stream %v: decoder %d emitted %v\nwant %v", stream, i, got[i][:n], recs[i].GeneratedIDs)
			}
			st := d.Stats()
			trees += st.TargetPasses
			steps += st.DraftSteps - st.PipelineSteps
			d.Close()
		}
		t.Logf("stream %v: %d rounds verified %d trees; %d draft steps before the passes took %d draft Forwards", stream, rounds, trees, steps, g.DraftPasses())
		// The decoders' steps share Forwards: fewer than the steps
		// whenever two decoders drafted in one round.
		if steps == 0 || g.DraftPasses() >= steps {
			t.Errorf("stream %v: %d draft steps before the passes took %d draft Forwards; want them shared", stream, steps, g.DraftPasses())
		}
		if stream {
			if passes := targetPasses(p.target) - passes0; passes != rounds || trees <= rounds {
				t.Errorf("%d passes over the target's weights for %d rounds verifying %d trees; want one a round, fewer than the trees", passes, rounds, trees)
			}
		}
	}
}

// targetPasses is how many passes a streamed model has made over its
// weights.
func targetPasses(m *model.Model) int {
	st, _ := m.StreamStats()
	return st.Passes
}

// BenchmarkGroupStep times four clients' 40 tokens each on one
// speculative lane, llama2xs drafting for stories260K inflated to the
// stories110m shape (Q4_0, 46 MB, written to a temporary directory; its tokens are
// stories260K's), streamed under its smallest budget from storage
// emulated at 400 MB/s, with the IO pipeline: each decoder verifying its
// own tree per pass (Step) against all four trees verified in one pass a
// round (Group).
// go test -bench GroupStep -run '^$' ./runtime/spec
func BenchmarkGroupStep(b *testing.B) {
	const n, clients = 40, 4
	recs := arRecords(b, "stories260K.greedy.jsonl")[:clients]
	draft := arLoadModel(b, "llama2xs_model.bin")
	src, err := weights.Open(testutil.Model(b, "stories260K.bin"))
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "s110m.gguf")
	err = weights.Inflate(src, path, weights.InflateOptions{Shape: weights.Shapes["stories110m"], Type: weights.Q4_0})
	src.Close()
	if err != nil {
		b.Fatal(err)
	}
	f, err := weights.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	plan, _, err := model.PlanStream(f, weights.StreamOptions{})
	if plan.Min == 0 {
		b.Fatalf("no minimum budget: %v", err)
	}
	lane := NewLane()
	target, err := model.Load(f, model.Options{Threads: 2, Lane: lane, Stream: &weights.StreamOptions{Budget: plan.Min,
		Mode: weights.StreamPipelined, Throttle: weights.Throttle{Bandwidth: 400e6}}})
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	cfg := Config{Method: Tree, Pipeline: true, Lane: lane}
	newCache := func(m *model.Model) *kv.Cache {
		c, err := m.NewTreeCache(specContext, cfg.TreeRows(), 0)
		if err != nil {
			b.Fatal(err)
		}
		kc := c.Config()
		kc.MaxSeqs = clients
		if c, err = kv.New(kc); err != nil {
			b.Fatal(err)
		}
		return c
	}
	dcache, tcache := newCache(draft), newCache(target)
	for _, grouped := range []bool{false, true} {
		name := "one-by-one"
		if grouped {
			name = "group"
		}
		b.Run(name, func(b *testing.B) {
			var g Group
			passes, read := 0, uint64(0)
			for b.Loop() {
				var decs []*Decoder
				for _, r := range recs {
					d, err := New(draft, target, dcache, tcache, nil, cfg)
					if err != nil {
						b.Fatal(err)
					}
					if err := d.Start(context.Background(), r.PromptIDs, 0); err != nil {
						b.Fatal(err)
					}
					decs = append(decs, d)
				}
				p0 := targetPasses(target)
				st0, _ := target.StreamStats()
				got := make([]int, clients)
				out, errs := make([][]int32, clients), make([]error, clients)
				for slices.Min(got) < n {
					if grouped {
						g.Step(context.Background(), decs, out, errs)
					} else {
						for i, d := range decs {
							out[i], errs[i] = d.Step(context.Background())
						}
					}
					for i := range decs {
						if errs[i] != nil {
							b.Fatal(errs[i])
						}
						got[i] += len(out[i])
					}
				}
				passes += targetPasses(target) - p0
				st, _ := target.StreamStats()
				read += st.BytesRead - st0.BytesRead
				for _, d := range decs {
					d.Close()
				}
			}
			b.ReportMetric(float64(passes)/float64(b.N), "passes/op")
			// The physical bound: the bytes read at the emulated bandwidth.
			b.ReportMetric(float64(read)/float64(b.N)/1e6, "MB-read/op")
			b.ReportMetric(float64(read)/float64(b.N)/400e6, "IO-bound-s/op")
		})
	}
}

// idlePacer picks no leaf.
type idlePacer struct{}

func (idlePacer) Pick(dst []int, _ *tree, _ []int, _, _ int) []int { return dst }

// TestPacerThatPicksNothing: a pacer that picks no leaf ends the tree's
// growth, alone and in a group, resident and streamed with the pipeline:
// every round verifies the root alone, the text is the target's, and no
// draft step is run or counted. The growth loops used to spin until the
// context ended, and the pipeline's loop spun beside each pass, counting
// a pipelined step a turn.
func TestPacerThatPicksNothing(t *testing.T) {
	r := arRecords(t, "stories260K.greedy.jsonl")[0]
	for _, stream := range []bool{false, true} {
		p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", stream)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cfg := Config{Method: Tree, Pacer: idlePacer{}, Trigger: FixedSize{N: 8}}
		d := p.decoder(t, cfg)
		res, err := Speculate(ctx, d, r.PromptIDs, GenOptions{MaxTokens: 12})
		if err != nil || !slices.Equal(res.Ids, r.GeneratedIDs[:12]) {
			t.Fatalf("stream=%v alone: %v, %v; want %v", stream, res.Ids, err, r.GeneratedIDs[:12])
		}
		if st := d.Stats(); st.DraftSteps != 0 || st.PipelineSteps != 0 {
			t.Errorf("stream=%v alone: %d draft steps, %d pipelined, with nothing picked", stream, st.DraftSteps, st.PipelineSteps)
		}
		decs := []*Decoder{p.decoder(t, cfg), p.decoder(t, cfg)}
		for _, d := range decs {
			if err := d.Start(ctx, r.PromptIDs, 0); err != nil {
				t.Fatal(err)
			}
			defer d.Close()
		}
		var g Group
		out, errs := make([][]int32, 2), make([]error, 2)
		g.Step(ctx, decs, out, errs)
		for i, d := range decs {
			if errs[i] != nil || !slices.Equal(out[i], r.GeneratedIDs[:1]) {
				t.Errorf("stream=%v group member %d: %v, %v; want %v", stream, i, out[i], errs[i], r.GeneratedIDs[:1])
			}
			if st := d.Stats(); st.DraftSteps != 0 || st.PipelineSteps != 0 {
				t.Errorf("stream=%v group member %d: %d draft steps, %d pipelined, with nothing picked", stream, i, st.DraftSteps, st.PipelineSteps)
			}
		}
		if g.DraftPasses() != 0 {
			t.Errorf("stream=%v: %d draft Forwards with nothing picked", stream, g.DraftPasses())
		}
	}
}
