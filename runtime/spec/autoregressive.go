package spec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// StopReason says why a generation ended.
type StopReason int

const (
	StopMaxTokens   StopReason = iota // GenOptions.MaxTokens reached
	StopToken                         // GenOptions.Stop accepted a token (it is the last id)
	StopContextFull                   // no room left in the model's or the cache's context
)

func (r StopReason) String() string {
	switch r {
	case StopMaxTokens:
		return "max tokens"
	case StopToken:
		return "stop token"
	case StopContextFull:
		return "context full"
	}
	return fmt.Sprintf("StopReason(%d)", int(r))
}

// GenOptions configures Generate.
type GenOptions struct {
	// MaxTokens bounds the generated ids (0: until a stop token or the
	// context is full).
	MaxTokens int
	// Sampler picks each token (nil: greedy).
	Sampler *sample.Sampler
	// Stop reports whether id ends the generation (EOS, or BOS for
	// llama2.c models); the stop id is kept as the last of Result.Ids.
	Stop func(id int32) bool
	// OnToken is called with each generated id except a stop id; an error
	// ends the generation and is returned.
	OnToken func(id int32) error
	// ChunkSize is the most prompt tokens evaluated per Forward
	// (default 256), which bounds the activation memory of a prefill.
	ChunkSize int
}

// Result is what Generate produced and how long it took.
type Result struct {
	Ids          []int32 // generated ids, a stop id last when Reason is StopToken
	Reason       StopReason
	PromptTokens int
	// PromptEval is the prefill of the prompt, up to its logits.
	// Speculate's is the draft's prefill and the target's of all but the
	// prompt's last chunk, which its first verification, in Decode, holds.
	PromptEval time.Duration
	Decode     time.Duration // sampling and one Forward per generated token (Speculate: per verification)
}

// DefaultChunkSize is the prefill chunk when GenOptions.ChunkSize is 0.
const DefaultChunkSize = 256

// Generate is the plain decode loop that every speculative mode is compared
// with: it prefills the prompt (in chunks, each one Batch chain) in a new
// sequence of cache, then feeds back one sampled token per Forward. The
// sequence is freed on return. Running out of context is not an error:
// the ids so far come back with Reason StopContextFull. A prompt that does
// not fit is an error wrapping kv.ErrContextFull.
func Generate(ctx context.Context, m *model.Model, cache *kv.Cache, prompt []int32, opt GenOptions) (res Result, err error) {
	res.PromptTokens = len(prompt)
	if len(prompt) == 0 {
		return res, errors.New("spec: generate: empty prompt; a llama prompt starts with BOS")
	}
	if opt.MaxTokens < 0 || opt.ChunkSize < 0 {
		return res, fmt.Errorf("spec: generate: MaxTokens %d and ChunkSize %d must not be negative", opt.MaxTokens, opt.ChunkSize)
	}
	chunk := opt.ChunkSize
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	sampler := opt.Sampler
	if sampler == nil {
		sampler = sample.New(sample.Options{})
	}
	limit := min(m.Config().Context, cache.Config().Context)
	if len(prompt) > limit {
		return res, fmt.Errorf("spec: generate: prompt of %d tokens does not fit the context of %d: %w", len(prompt), limit, kv.ErrContextFull)
	}
	seq, err := cache.NewSeq()
	if err != nil {
		return res, fmt.Errorf("spec: generate: %w", err)
	}
	defer cache.Free(seq)

	var (
		b   model.Batch
		out model.Logits
	)
	step := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := m.Forward(&b, cache, &out); err != nil {
			return fmt.Errorf("spec: generate: %w", err)
		}
		return cache.CommitAll(seq)
	}

	start := time.Now()
	for off := 0; off < len(prompt); off += chunk {
		end := min(off+chunk, len(prompt))
		b.Reset()
		b.Chain(prompt[off:end], int32(off), seq, -1, end == len(prompt))
		if err := step(); err != nil {
			return res, err
		}
	}
	res.PromptEval = time.Since(start)

	start = time.Now()
	defer func() { res.Decode = time.Since(start) }()
	// The context bounds what can be generated, whatever MaxTokens asks
	// (a huge one reserved gigabytes up front).
	room := limit - len(prompt) + 1
	if opt.MaxTokens > 0 {
		room = min(room, opt.MaxTokens)
	}
	history := append(make([]int32, 0, len(prompt)+room), prompt...)
	logits := out.Row(b.Len() - 1)
	for {
		id := sampler.Sample(logits, history)
		res.Ids = append(res.Ids, id)
		history = append(history, id)
		if opt.Stop != nil && opt.Stop(id) {
			res.Reason = StopToken
			return res, nil
		}
		if opt.OnToken != nil {
			if err := opt.OnToken(id); err != nil {
				return res, err
			}
		}
		if opt.MaxTokens > 0 && len(res.Ids) >= opt.MaxTokens {
			res.Reason = StopMaxTokens
			return res, nil
		}
		pos := cache.Len(seq)
		if pos >= limit {
			res.Reason = StopContextFull
			return res, nil
		}
		b.Reset()
		b.Add(id, int32(pos), seq, -1, true)
		if err := step(); err != nil {
			return res, err
		}
		logits = out.Row(0)
	}
}
