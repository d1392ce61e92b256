package spec

import (
	"context"
	"errors"
	"time"

	"github.com/tandem-llm/tandem/runtime/kv"
)

// Speculate generates from prompt with the decoder's pair, as Generate
// does with one model: it stops at MaxTokens, at a Stop token (kept as the
// last id) or when the context is full, and calls OnToken for every other
// id. Tokens come from the decoder's sampler; opt.Sampler is not used.
// The decoder's sequences are freed on return.
func Speculate(ctx context.Context, d *Decoder, prompt []int32, opt GenOptions) (res Result, err error) {
	res.PromptTokens = len(prompt)
	if opt.MaxTokens < 0 || opt.ChunkSize < 0 {
		return res, errors.New("spec: speculate: MaxTokens and ChunkSize must not be negative")
	}
	start := time.Now()
	if err := d.Start(ctx, prompt, opt.ChunkSize); err != nil {
		return res, err
	}
	defer d.Close()
	res.PromptEval = time.Since(start)

	start = time.Now()
	defer func() { res.Decode = time.Since(start) }()
	for {
		ids, err := d.Step(ctx)
		if errors.Is(err, kv.ErrContextFull) {
			res.Reason = StopContextFull
			return res, nil
		}
		if err != nil {
			return res, err
		}
		for _, id := range ids {
			res.Ids = append(res.Ids, id)
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
		}
	}
}
