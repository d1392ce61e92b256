package weights

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
)

// SynthOptions describes a synthetic random-weight model.
type SynthOptions struct {
	Shape Shape
	Type  DType  // matrix type (F32, F16, BF16, Q8_0, Q4_0)
	Seed  uint64 // same seed, same bytes
	// Vocab holds tokenizer.ggml.* keys; nil writes ByteVocab(Shape.Vocab).
	Vocab *Metadata
	// Progress is called with bytes written and the total.
	Progress func(done, total uint64)
}

// synthChunk is the number of weights generated and quantized per task.
const synthChunk = 1 << 20

// Synth writes a deterministic random-weight llama model to path. Tensors
// are generated and quantized a chunk at a time on all cores and streamed
// to disk, so peak memory stays at a few chunks whatever the model size.
// Weights are uniform with standard deviation 0.02 (as model
// initialisations use); norms are 1.
func Synth(path string, opt SynthOptions) error {
	s := opt.Shape
	if err := s.Validate(); err != nil {
		return err
	}
	if !canQuantize(opt.Type) {
		return fmt.Errorf("synth: cannot write %s weights (choose f32, f16, bf16, q8_0 or q4_0)", opt.Type)
	}
	vocab := opt.Vocab
	if vocab == nil {
		if s.Vocab < MinByteVocab {
			return fmt.Errorf("synth: a vocabulary of %d tokens: the byte vocabulary made without a real one needs at least %d (3 special, 256 bytes and ▁); give a larger one, or a real vocabulary", s.Vocab, MinByteVocab)
		}
		vocab = ByteVocab(s.Vocab)
	}
	toks, err := vocab.Strings("tokenizer.ggml.tokens")
	if err != nil {
		return fmt.Errorf("synth: the vocabulary has no token list: %w", err)
	}
	if len(toks) != s.Vocab {
		return fmt.Errorf("synth: the vocabulary has %d tokens but shape %s needs %d; pick a matching --vocab or --dims", len(toks), s.Name, s.Vocab)
	}
	md := s.Metadata("synthetic "+s.Name, opt.Type)
	for _, kv := range vocab.All() {
		md.Set(kv.Key, kv.Value)
	}
	infos := s.Tensors(opt.Type)
	var total, done uint64
	for _, t := range infos {
		n, err := t.Bytes()
		if err != nil {
			return fmt.Errorf("synth: %w", err)
		}
		total += n
	}
	workers := runtime.GOMAXPROCS(0)
	return WriteGGUF(path, md, infos, func(i int, w io.Writer) error {
		t := infos[i]
		if len(t.Shape) == 1 {
			ones := make([]float32, t.Shape[0])
			for j := range ones {
				ones[j] = 1
			}
			buf := make([]byte, 4*len(ones))
			if err := Quantize(F32, ones, buf); err != nil {
				return fmt.Errorf("synth: %s: %w", t.Name, err)
			}
			_, err := w.Write(buf)
			done += uint64(len(buf))
			return err
		}
		cols := int(t.Shape[0])
		rows := int(t.Shape[1])
		rowBytes, _ := t.Type.RowBytes(uint64(cols))
		step := max(1, synthChunk/cols)
		chunks := (rows + step - 1) / step
		outs := make([][]byte, workers)
		for c0 := 0; c0 < chunks; c0 += workers {
			var wg sync.WaitGroup
			errs := make([]error, workers)
			for k := 0; k < workers && c0+k < chunks; k++ {
				wg.Add(1)
				go func(k int) {
					defer wg.Done()
					c := c0 + k
					n := min(step, rows-c*step)
					f := make([]float32, n*cols)
					fillUniform(f, opt.Seed, uint64(i), uint64(c))
					outs[k] = grow(outs[k], n*int(rowBytes))
					errs[k] = Quantize(t.Type, f, outs[k])
				}(k)
			}
			wg.Wait()
			for k := 0; k < workers && c0+k < chunks; k++ {
				if errs[k] != nil {
					return fmt.Errorf("synth: %s: %w", t.Name, errs[k])
				}
				if _, err := w.Write(outs[k]); err != nil {
					return err
				}
				done += uint64(len(outs[k]))
			}
			if opt.Progress != nil {
				opt.Progress(done, total)
			}
		}
		return nil
	})
}

// fillUniform fills f with uniform values of standard deviation 0.02 from
// a splitmix64 stream keyed by (seed, tensor, chunk).
func fillUniform(f []float32, seed, tensor, chunk uint64) {
	state := seed*0x9E3779B97F4A7C15 ^ tensor<<40 ^ chunk
	const a = 0.02 * 1.7320508 // half-width of a uniform with std 0.02
	for i := 0; i < len(f); i += 2 {
		state += 0x9E3779B97F4A7C15
		z := state
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		z ^= z >> 31
		f[i] = (float32(uint32(z))/math.MaxUint32*2 - 1) * a
		if i+1 < len(f) {
			f[i+1] = (float32(uint32(z>>32))/math.MaxUint32*2 - 1) * a
		}
	}
}

// MinByteVocab is the smallest ByteVocab that holds its fixed tokens:
// fewer lose bytes, and with them text they can encode.
const MinByteVocab = 3 + 256 + 1

// ByteVocab is a SentencePiece-style vocabulary of n tokens that can
// encode any text: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>,
// the space marker ▁, then filler pieces. Synthetic models use it when no
// real vocabulary is given.
func ByteVocab(n int) *Metadata {
	toks := make([]string, 0, n)
	types := make([]int32, 0, n)
	toks = append(toks, "<unk>", "<s>", "</s>")
	types = append(types, 2, 3, 3)
	for b := 0; b < 256; b++ {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
		types = append(types, 6)
	}
	toks = append(toks, "▁")
	types = append(types, 1)
	for i := len(toks); i < n; i++ {
		toks = append(toks, fmt.Sprintf("▁tok%d", i))
		types = append(types, 1)
	}
	toks, types = toks[:min(n, len(toks))], types[:min(n, len(types))]
	scores := make([]float32, len(toks))
	md := &Metadata{}
	md.Set("tokenizer.ggml.model", StringValue("llama"))
	md.Set("tokenizer.ggml.tokens", StringsValue(toks))
	md.Set("tokenizer.ggml.scores", Float32sValue(scores))
	md.Set("tokenizer.ggml.token_type", Int32sValue(types))
	md.Set("tokenizer.ggml.unknown_token_id", Uint32Value(0))
	md.Set("tokenizer.ggml.bos_token_id", Uint32Value(1))
	md.Set("tokenizer.ggml.eos_token_id", Uint32Value(2))
	return md
}
