package defaultmodel

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/corpus"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/runtime/train"
	"github.com/tandem-llm/tandem/weights"
)

// TestQuality checks the pair is what README's "Training" says, on
// stories the models never saw and the held-out prompts in prompts.txt:
// the target is 2-5M parameters and the draft 0.2-0.5M, the target wins
// on held-out loss, the draft's greedy top-1 agrees with the target at
// least 70% of the time, and tree speculation accepts at least 2.5
// tokens per target pass (the goals for the default pair).
//
// The tree is verified at four drafted tokens, about the size the
// default trigger (CostAware) chooses for this resident pair on a quiet
// machine. CostAware sizes trees from measured times, so its figure is
// the machine's as much as the pair's: on a 2-vCPU VM with two busy
// processes beside it, one build gave 4.1-4.5 tokens per pass and the
// next, whose kernel pool stopped splitting jobs the busy cores slowed,
// 2.1-2.5 while it decoded 1.7 times as fast.
func TestQuality(t *testing.T) {
	pool := kernels.NewPool(0)
	defer pool.Close()
	target, tok := load(t, Target, pool)
	draft, _ := load(t, Draft, pool)
	tp, dp := train.CountParams(target.Config()), train.CountParams(draft.Config())
	if tp < 2e6 || tp > 5e6 || dp < 2e5 || dp > 5e5 {
		t.Errorf("target %d and draft %d parameters, want 2-5M and 0.2-0.5M", tp, dp)
	}

	var docs []string
	for i := range 40 {
		docs = append(docs, corpus.Story(1, 200_000_000+i)) // far past the training corpus
	}
	stream, err := train.EncodeDocs(tok, docs)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tl, _, err := train.HeldOutLoss(ctx, target, stream, 256, 16)
	if err != nil {
		t.Fatal(err)
	}
	dl, _, err := train.HeldOutLoss(ctx, draft, stream, 256, 16)
	if err != nil {
		t.Fatal(err)
	}
	if !(tl < dl) || tl > 1.5 {
		t.Errorf("held-out loss: target %.3f, draft %.3f nats/token; want the target lower, under 1.5", tl, dl)
	}

	b, err := os.ReadFile("prompts.txt")
	if err != nil {
		t.Fatal(err)
	}
	var prompts [][]int32
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && len(prompts) < 12 {
			ids, err := tok.Encode(l, tokenizer.EncodeOptions{AddBOS: true})
			if err != nil {
				t.Fatal(err)
			}
			prompts = append(prompts, ids)
		}
	}
	stop := func(id int32) bool { return id == tok.EOS() || id == tok.BOS() }
	gen := 48
	agree, err := train.Agreement(ctx, draft, target, prompts, gen, stop)
	if err != nil {
		t.Fatal(err)
	}
	if agree.Rate() < 0.7 {
		t.Errorf("the draft agrees with the target at %.3f of %d positions, want at least 0.7", agree.Rate(), agree.Positions)
	}

	var passes, emitted int
	for _, p := range prompts {
		tc, err := target.NewCache(256, weights.F32)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := draft.NewCache(256, weights.F32)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := spec.New(draft, target, dc, tc, nil, spec.Config{Method: spec.Tree, Trigger: spec.FixedSize{N: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := spec.Speculate(ctx, dec, p, spec.GenOptions{MaxTokens: gen, Stop: stop}); err != nil {
			t.Fatal(err)
		}
		st := dec.Stats()
		passes += st.TargetPasses
		emitted += st.Emitted
		dec.Close()
	}
	perPass := float64(emitted) / float64(passes)
	t.Logf("held-out loss target %.3f, draft %.3f nats/token; agreement %.3f over %d positions; tree %.2f tokens per target pass",
		tl, dl, agree.Rate(), agree.Positions, perPass)
	if perPass < 2.5 {
		t.Errorf("tree speculation emitted %.2f tokens per target pass (%d over %d), want at least 2.5", perPass, emitted, passes)
	}
}

func load(t *testing.T, open func() (*weights.File, error), pool *kernels.Pool) (*model.Model, *tokenizer.Tokenizer) {
	t.Helper()
	f, err := open()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromMetadata(&f.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, tok
}
