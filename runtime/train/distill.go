package train

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/weights"
)

// SampleOptions configures Sample.
type SampleOptions struct {
	Sequences int // sequences to sample
	Length    int // tokens per sequence, the BOS and prompt included
	// Parallel sequences decode together in one Forward (default 16):
	// the target's weights are read once for all of them.
	Parallel int
	// Prompts, when set, start the sequences (each one BOS + a prompt
	// chosen with the seed); otherwise sequences start with BOS alone.
	Prompts [][]int32
	// BOS starts a sequence; a sampled BOS or EOS ends a story, after
	// which the sequence continues with BOS (and a new story), as in the
	// training corpus. EOS may be -1.
	BOS, EOS    int32
	Temperature float32 // default 1: the target's own distribution
	Seed        uint64
	Progress    func(done, total int)
}

// Sample draws text from a model: Sequences sequences of exactly Length
// tokens, concatenated. With Temperature 1 they follow the model's own
// distribution, the data a draft is distilled on.
func Sample(ctx context.Context, m *model.Model, o SampleOptions) ([]int32, error) {
	c := m.Config()
	// The last token of a sequence is sampled, never fed: Length may
	// be the context plus one, as a training window is.
	if o.Sequences <= 0 || o.Length < 2 || o.Length > c.Context+1 {
		return nil, fmt.Errorf("train: sample %d sequences of %d tokens: want at least one of 2..%d (the model's context + 1)", o.Sequences, o.Length, c.Context+1)
	}
	if o.BOS < 0 || int(o.BOS) >= c.Vocab {
		return nil, fmt.Errorf("train: sample: BOS %d is outside the vocabulary of %d", o.BOS, c.Vocab)
	}
	for i, p := range o.Prompts {
		if 1+len(p) >= o.Length {
			return nil, fmt.Errorf("train: sample: prompt %d has %d tokens, too long for sequences of %d", i, len(p), o.Length)
		}
	}
	// The text is kept whole; two trillion tokens asked for ran the
	// process out of memory before the first was sampled.
	if need := 4 * float64(o.Sequences) * float64(o.Length); need > 0 {
		if avail, err := availableMemory(); err == nil && need > float64(avail) {
			return nil, fmt.Errorf("train: sample %d sequences of %d tokens: they need %s, and %s is available; sample fewer tokens",
				o.Sequences, o.Length, progress.Bytes(uint64(min(need, math.MaxInt64))), progress.Bytes(avail))
		}
	}
	if o.Parallel <= 0 {
		o.Parallel = 16
	}
	if o.Temperature == 0 {
		o.Temperature = 1
	}
	cache, err := kv.New(kv.Config{Layers: c.Layers, KVDim: c.KVDim(), Context: o.Length - 1, Type: weights.F32})
	if err != nil {
		return nil, err
	}
	out := make([]int32, 0, o.Sequences*o.Length)
	var b model.Batch
	var logits model.Logits
	for first := 0; first < o.Sequences; first += o.Parallel {
		n := min(o.Parallel, o.Sequences-first)
		seqs := make([]int, n)
		toks := make([][]int32, n)
		// Each sequence draws from its own stream, so the text does not
		// depend on how many sequences decode together.
		smps := make([]*sample.Sampler, n)
		b.Reset()
		for i := range n {
			idx := uint64(first + i)
			smps[i] = sample.New(sample.Options{Temperature: o.Temperature, Seed: o.Seed ^ (idx+1)*0x9E3779B97F4A7C15})
			if seqs[i], err = cache.NewSeq(); err != nil {
				return nil, err
			}
			toks[i] = append(make([]int32, 0, o.Length), o.BOS)
			if len(o.Prompts) > 0 {
				pick := rand.New(rand.NewPCG(o.Seed, idx))
				toks[i] = append(toks[i], o.Prompts[pick.IntN(len(o.Prompts))]...)
			}
			b.Chain(toks[i], 0, seqs[i], -1, true)
		}
		last := make([]int, n) // batch slot holding each sequence's logits
		for {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if err := m.Forward(&b, cache, &logits); err != nil {
				return nil, fmt.Errorf("train: sample: %w", err)
			}
			for i := range n {
				if err := cache.CommitAll(seqs[i]); err != nil {
					return nil, err
				}
			}
			for _, s := range logits.Slots() {
				i := indexOf(seqs, b.Seq[s])
				last[i] = s
			}
			b.Reset()
			active := 0
			for i := range n {
				if len(toks[i]) >= o.Length {
					continue
				}
				id := smps[i].Sample(logits.Row(last[i]), nil)
				feed := []int32{id}
				if id == o.EOS && o.BOS != o.EOS {
					feed = append(feed, o.BOS) // the corpus layout: ... EOS BOS next story
				}
				feed = feed[:min(len(feed), o.Length-len(toks[i]))]
				pos := int32(len(toks[i]))
				toks[i] = append(toks[i], feed...)
				if len(toks[i]) < o.Length {
					b.Chain(feed, pos, seqs[i], -1, true)
					active++
				}
			}
			if active == 0 {
				break
			}
		}
		for i := range n {
			out = append(out, toks[i]...)
			cache.Free(seqs[i])
		}
		if o.Progress != nil {
			o.Progress(first+n, o.Sequences)
		}
	}
	return out, nil
}

func indexOf(xs []int, x int) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// ModelTeacher gives a runtime model's next-token distributions as soft
// targets: the target a draft is distilled from runs exactly as it runs
// at inference (quantized or not).
type ModelTeacher struct {
	M *model.Model
	// Temperature softens the distributions (default 1).
	Temperature float32

	cache  *kv.Cache
	b      model.Batch
	logits model.Logits
}

// Probs runs the batch's sequences through the model, all in one Forward,
// and writes the softmax of every position's logits to dst.
func (t *ModelTeacher) Probs(b *Batch, dst []float32) error {
	c := t.M.Config()
	if b.T > c.Context {
		return fmt.Errorf("teacher context %d is shorter than the sequences (%d)", c.Context, b.T)
	}
	if len(dst) != b.B*b.T*c.Vocab {
		return fmt.Errorf("teacher: %d soft targets for %d positions of vocabulary %d", len(dst), b.B*b.T, c.Vocab)
	}
	if t.cache == nil || t.cache.Config().Context < b.T {
		var err error
		if t.cache, err = kv.New(kv.Config{Layers: c.Layers, KVDim: c.KVDim(), Context: b.T, Type: weights.F32}); err != nil {
			return err
		}
	}
	temp := float64(t.Temperature)
	if temp == 0 {
		temp = 1
	}
	t.b.Reset()
	seqs := make([]int, b.B)
	for i := range b.B {
		s, err := t.cache.NewSeq()
		if err != nil {
			return err
		}
		seqs[i] = s
		parent := -1
		for j, tok := range b.Tokens[i*b.T : (i+1)*b.T] {
			parent = t.b.Add(tok, int32(j), s, parent, true)
		}
	}
	defer func() {
		for _, s := range seqs {
			t.cache.Free(s)
		}
	}()
	if err := t.M.Forward(&t.b, t.cache, &t.logits); err != nil {
		return fmt.Errorf("teacher: %w", err)
	}
	V := c.Vocab
	for i := range b.B * b.T {
		softmaxTo(dst[i*V:(i+1)*V], t.logits.Row(i), temp)
	}
	return nil
}

// softmaxTo sets dst = softmax(logits/temp).
func softmaxTo(dst, logits []float32, temp float64) {
	mx := logits[0]
	for _, v := range logits[1:] {
		mx = max(mx, v)
	}
	var z float64
	for j, v := range logits {
		e := math.Exp(float64(v-mx) / temp)
		dst[j] = float32(e)
		z += e
	}
	iz := float32(1 / z)
	for j := range dst {
		dst[j] *= iz
	}
}
