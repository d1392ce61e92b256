package spec

import (
	"context"
	"slices"
	"testing"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// TestSpeculativeSamplingDistribution: with temperature, the first two
// tokens the pair emits are distributed exactly as the target's own: the
// first as the target's sampling distribution after the prompt, the
// second as its marginal Σ_t1 p(t1)·p(t2|t1), computed exactly with one
// batch holding every t1 as its own branch. Thousands of seeded runs per
// configuration, held to it by a chi-square test at a 1e-6 false-alarm
// rate (so fixed seeds make it deterministic, and a biased sampler fails
// by far).
func TestSpeculativeSamplingDistribution(t *testing.T) {
	trials := 3000
	if raceEnabled || testing.Short() {
		trials = 1000
	}
	p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", false)
	prompt := []int32{1} // BOS alone: the first tokens of a story vary the most
	for _, tc := range []struct {
		name string
		opt  sample.Options
		cfg  Config
	}{
		{"tree t=1", sample.Options{Temperature: 1}, Config{Method: Tree}},
		{"tree t=1 free rows", sample.Options{Temperature: 1}, Config{Method: Tree, Trigger: fixedFill{FixedSize{N: 3}, 24}}},
		{"sd t=1.3 top-k 40 top-p 0.95", sample.Options{Temperature: 1.3, TopK: 40, TopP: 0.95}, Config{Method: SD, DraftLen: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p1, p2 := exactTwoTokens(t, p.target, prompt, tc.opt)
			c1 := make([]int, len(p1))
			c2 := make([]int, len(p2))
			var passes, drafted, filled int
			for i := range trials {
				opt := tc.opt
				opt.Seed = uint64(i) + 1
				d, err := New(p.draft, p.target, p.dcache, p.tcache, sample.New(opt), tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Speculate(context.Background(), d, prompt, GenOptions{MaxTokens: 2})
				if err != nil {
					t.Fatal(err)
				}
				c1[res.Ids[0]]++
				c2[res.Ids[1]]++
				st := d.Stats()
				passes += st.TargetPasses
				drafted += st.Accepted
				filled += st.FilledAccepted
			}
			for i, c := range []struct {
				counts []int
				p      []float64
			}{{c1, p1}, {c2, p2}} {
				stat, df := chiSquare(c.counts, c.p, trials)
				if df < 5 {
					t.Fatalf("token %d: only %d degrees of freedom; the distribution is too peaked to test", i+1, df)
				}
				if limit := chiSquareLimit(df); stat > limit {
					t.Errorf("token %d is not distributed as the target's: chi-square %.1f > %.1f (df %d)", i+1, stat, limit, df)
				} else {
					t.Logf("token %d: chi-square %.1f (df %d, limit %.1f)", i+1, stat, df, limit)
				}
			}
			if drafted == 0 {
				t.Errorf("no drafted token was ever accepted in %d runs: the test did not exercise speculation", trials)
			}
			if _, ok := tc.cfg.Trigger.(Filler); ok && filled == 0 {
				t.Errorf("no token from a free row was ever accepted in %d runs: the test did not exercise filling", trials)
			}
			t.Logf("%d target passes and %d accepted draft tokens (%d from free rows) for %d tokens", passes, drafted, filled, 2*trials)
		})
	}
}

// exactTwoTokens returns the target's sampling distribution of the first
// token after prompt and the marginal of the second.
func exactTwoTokens(t *testing.T, m *model.Model, prompt []int32, opt sample.Options) (p1, p2 []float64) {
	t.Helper()
	cache := arNewCache(t, m, specContext)
	seq, _ := cache.NewSeq()
	var b model.Batch
	var out model.Logits
	b.Chain(prompt, 0, seq, -1, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	cache.CommitAll(seq)
	s := sample.New(opt)
	first := s.Probs(out.Row(len(prompt)-1), prompt)
	vocab := len(first)
	p1 = make([]float64, vocab)
	p2 = make([]float64, vocab)
	// Every possible first token as its own root slot (each attends to
	// the prompt and itself only), in batches that fit the cache.
	var toks []int32
	for tok, pr := range first {
		p1[tok] = float64(pr)
		if pr > 0 {
			toks = append(toks, int32(tok))
		}
	}
	for len(toks) > 0 {
		n := min(len(toks), cache.Room(seq))
		b.Reset()
		for _, tok := range toks[:n] {
			b.Add(tok, int32(len(prompt)), seq, -1, true)
		}
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatal(err)
		}
		cache.Drop(seq)
		for i, tok := range toks[:n] {
			hist := append(append([]int32(nil), prompt...), tok)
			for t2, pr := range s.Probs(out.Row(i), hist) {
				p2[t2] += p1[tok] * float64(pr)
			}
		}
		toks = toks[n:]
	}
	return p1, p2
}

// TestSampledSpeculationIsTheTargetsText: with temperature, every lossless
// method emits the very tokens the target alone draws with the same seed,
// whatever its trees were: timed triggers that grow them differently
// from run to run, free rows, and a streamed target whose draft grows the
// next round's nodes during the pass (kept under the accepted path).
func TestSampledSpeculationIsTheTargetsText(t *testing.T) {
	opts := []sample.Options{
		{Temperature: 0.8},
		{Temperature: 1.3, TopK: 40, TopP: 0.95},
		{Temperature: 1, MinP: 0.05, RepeatPenalty: 1.3, RepeatLastN: 16},
	}
	seeds := 4
	if raceEnabled || testing.Short() {
		seeds = 1
	}
	prompt := []int32{1, 403, 407}
	for _, stream := range []bool{false, true} {
		p := loadPair(t, "llama2xs_model.bin", "stories260K.bin", stream)
		for _, m := range append(parityMethods, struct {
			name string
			cfg  Config
		}{"tree-free-rows", Config{Method: Tree, Trigger: fixedFill{FixedSize{N: 3}, 24}}}) {
			var emitted, passes, accepted, verified, kept int
			for _, opt := range opts {
				for seed := range seeds {
					opt.Seed = uint64(seed) + 1
					alone, err := Generate(context.Background(), p.target, p.tcache, prompt, GenOptions{MaxTokens: 120, Stop: arIsBOS, Sampler: sample.New(opt)})
					if err != nil {
						t.Fatal(err)
					}
					cfg := m.cfg
					cfg.Lane, cfg.Pipeline = p.lane, p.lane != nil
					d, err := New(p.draft, p.target, p.dcache, p.tcache, sample.New(opt), cfg)
					if err != nil {
						t.Fatal(err)
					}
					res, err := Speculate(context.Background(), d, prompt, GenOptions{MaxTokens: 120, Stop: arIsBOS})
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(res.Ids, alone.Ids) {
						t.Fatalf("stream=%v %s %+v:\n got %v\nwant %v (the target alone)", stream, m.name, opt, res.Ids, alone.Ids)
					}
					st := d.Stats()
					emitted, passes, accepted, verified, kept = emitted+st.Emitted, passes+st.TargetPasses, accepted+st.Accepted, verified+st.Verified, kept+st.KeptNodes
				}
			}
			t.Logf("stream=%v %s: %d tokens in %d target passes (%.2f per pass), %d of %d drafted tokens accepted, %d kept from pipelined steps",
				stream, m.name, emitted, passes, float64(emitted)/float64(passes), accepted, verified, kept)
			if accepted == 0 {
				t.Errorf("stream=%v %s: no drafted token was accepted: the test did not exercise speculation", stream, m.name)
			}
			// sd's chains do not depend on timings: raced with the words
			// the target draws them with, they give 2.3 tokens a pass;
			// raced with the word one draw off, 1.65.
			if m.name == "sd" && float64(emitted) < 2*float64(passes) {
				t.Errorf("stream=%v sd: %.2f tokens a pass; the draft's chains missed the target's draws", stream, float64(emitted)/float64(passes))
			}
		}
	}
}
