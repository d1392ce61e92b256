package train

import (
	"context"
	"fmt"
	"math"

	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// runner evaluates whole sequences on a runtime model, reusing a cache.
type runner struct {
	m      *model.Model
	cache  *kv.Cache
	b      model.Batch
	logits model.Logits
}

func newRunner(m *model.Model, context int) (*runner, error) {
	c := m.Config()
	if context > c.Context {
		return nil, fmt.Errorf("train: %d tokens do not fit the model's context of %d", context, c.Context)
	}
	cache, err := kv.New(kv.Config{Layers: c.Layers, KVDim: c.KVDim(), Context: context, Type: weights.F32})
	if err != nil {
		return nil, err
	}
	return &runner{m: m, cache: cache}, nil
}

// rows runs each sequence as a prefill chain (all in one Forward) and
// returns the logits of every slot, sequence after sequence.
func (r *runner) rows(seqs [][]int32) ([][]float32, error) {
	r.b.Reset()
	ids := make([]int, len(seqs))
	defer func() {
		for _, s := range ids {
			r.cache.Free(s)
		}
	}()
	for i, toks := range seqs {
		s, err := r.cache.NewSeq()
		if err != nil {
			return nil, err
		}
		ids[i] = s
		parent := -1
		for j, t := range toks {
			parent = r.b.Add(t, int32(j), s, parent, true)
		}
	}
	if err := r.m.Forward(&r.b, r.cache, &r.logits); err != nil {
		return nil, err
	}
	out := make([][]float32, r.b.Len())
	for i := range out {
		out[i] = r.logits.Row(i)
	}
	return out, nil
}

// greedy continues prompt with the model's most likely tokens until
// max tokens, a stop token (kept) or the runner's context.
func (r *runner) greedy(prompt []int32, max int, stop func(int32) bool) ([]int32, error) {
	s, err := r.cache.NewSeq()
	if err != nil {
		return nil, err
	}
	defer r.cache.Free(s)
	r.b.Reset()
	r.b.Chain(prompt, 0, s, -1, true)
	var out []int32
	limit := r.cache.Config().Context
	for {
		if err := r.m.Forward(&r.b, r.cache, &r.logits); err != nil {
			return nil, err
		}
		if err := r.cache.CommitAll(s); err != nil {
			return nil, err
		}
		id := argmax(r.logits.Row(r.b.Len() - 1))
		out = append(out, id)
		if len(out) >= max || (stop != nil && stop(id)) || len(prompt)+len(out) >= limit {
			return out, nil
		}
		r.b.Reset()
		r.b.Add(id, int32(len(prompt)+len(out)-1), s, -1, true)
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// nll is −log softmax(logits)[tok].
func nll(logits []float32, tok int32) float64 {
	mx := logits[0]
	for _, v := range logits[1:] {
		mx = max(mx, v)
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v - mx))
	}
	return float64(mx) + math.Log(z) - float64(logits[tok])
}

// AgreementResult is how often a draft's greedy choice matches a
// target's along the target's own greedy continuations.
type AgreementResult struct {
	Prompts   int
	Positions int // predictions compared
	Agree     int // where the draft's most likely token is the target's
	// TargetNLL and DraftNLL are the mean negative log-likelihoods
	// (nats) of the target's greedy tokens under each model.
	TargetNLL, DraftNLL float64
	// Continuations are the target's greedy tokens per prompt (a stop
	// token last when one ended it).
	Continuations [][]int32
}

// Rate is Agree / Positions: the chance a greedy speculative step
// accepts the draft's token.
func (r AgreementResult) Rate() float64 {
	if r.Positions == 0 {
		return 0
	}
	return float64(r.Agree) / float64(r.Positions)
}

// Agreement runs the target greedily from each prompt (prompts include
// BOS) for up to gen tokens, then feeds prompt and continuation to both
// models and compares their most likely next tokens at every generated
// position: the metric speculative decoding's greedy acceptance follows.
// stop ends a continuation (EOS, or BOS for llama2.c models).
func Agreement(ctx context.Context, draft, target *model.Model, prompts [][]int32, gen int, stop func(int32) bool) (AgreementResult, error) {
	var res AgreementResult
	dc, tc := draft.Config(), target.Config()
	if dc.Vocab != tc.Vocab {
		return res, fmt.Errorf("train: agreement: the draft's vocabulary has %d tokens, the target's %d", dc.Vocab, tc.Vocab)
	}
	limit := min(dc.Context, tc.Context)
	tr, err := newRunner(target, limit)
	if err != nil {
		return res, err
	}
	dr, err := newRunner(draft, limit)
	if err != nil {
		return res, err
	}
	var tn, dn float64
	for pi, p := range prompts {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if len(p) == 0 || len(p) >= limit {
			return res, fmt.Errorf("train: agreement: prompt %d has %d tokens; want 1..%d", pi, len(p), limit-1)
		}
		cont, err := tr.greedy(p, gen, stop)
		if err != nil {
			return res, fmt.Errorf("train: agreement: prompt %d: %w", pi, err)
		}
		res.Continuations = append(res.Continuations, cont)
		full := append(append([]int32{}, p...), cont...)
		in := [][]int32{full[:len(full)-1]}
		tl, err := tr.rows(in)
		if err != nil {
			return res, err
		}
		dl, err := dr.rows(in)
		if err != nil {
			return res, err
		}
		for j := len(p) - 1; j < len(full)-1; j++ {
			next := full[j+1]
			if argmax(dl[j]) == argmax(tl[j]) {
				res.Agree++
			}
			res.Positions++
			tn += nll(tl[j], next)
			dn += nll(dl[j], next)
		}
		res.Prompts++
	}
	if res.Positions > 0 {
		res.TargetNLL = tn / float64(res.Positions)
		res.DraftNLL = dn / float64(res.Positions)
	}
	return res, nil
}

// HeldOutLoss is a model's mean negative log-likelihood (nats per token)
// of a token stream, over windows of t+1 tokens starting every t tokens
// (at most maxWindows; 0: all), each evaluated from position 0 as the
// model saw its training windows.
func HeldOutLoss(ctx context.Context, m *model.Model, tokens []int32, t, maxWindows int) (loss float64, count int, err error) {
	w, err := NewWindows(tokens, t, 0)
	if err != nil {
		return 0, 0, err
	}
	n := w.Len()
	if maxWindows > 0 {
		n = min(n, maxWindows)
	}
	r, err := newRunner(m, t)
	if err != nil {
		return 0, 0, err
	}
	const per = 8 // windows per Forward
	var total float64
	for first := 0; first < n; first += per {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		k := min(per, n-first)
		seqs := make([][]int32, k)
		for i := range k {
			seqs[i] = tokens[(first+i)*t : (first+i)*t+t]
		}
		rows, err := r.rows(seqs)
		if err != nil {
			return 0, 0, fmt.Errorf("train: held-out loss: %w", err)
		}
		for i := range k {
			for j := range t {
				total += nll(rows[i*t+j], tokens[(first+i)*t+j+1])
				count++
			}
		}
	}
	return total / float64(count), count, nil
}
