package sched

import (
	"fmt"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// SetTextPrompt fills r from a text prompt: the ids tok encodes (BOS
// first), the text for the uncertainty features, EOS and BOS as stop
// tokens (llama2.c models end a story with BOS), and a text decoder primed
// with the prompt so that the first generated piece keeps its spacing.
func (r *Request) SetTextPrompt(tok *tokenizer.Tokenizer, text string) error {
	ids, err := tok.Encode(text, tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		return fmt.Errorf("%w: prompt: cannot tokenize: %v", ErrInvalid, err)
	}
	r.Prompt, r.Text = ids, text
	r.StopTokens = r.StopTokens[:0:0]
	for _, id := range []int32{tok.EOS(), tok.BOS()} {
		if id >= 0 {
			r.StopTokens = append(r.StopTokens, id)
		}
	}
	dec := tok.NewDecoder()
	for _, id := range ids {
		dec.Next(id)
	}
	r.Decoder = dec
	return nil
}
