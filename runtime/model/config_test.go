package model

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/weights"
)

func TestConfigFrom(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Config
	}{
		{"stories260K.bin", Config{Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 512, Context: 512, Eps: 1e-5, RopeTheta: 10000, Tied: true}},
		{"stories260K.gguf", Config{Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 512, Context: 2048, Eps: 1e-5, RopeTheta: 10000, Tied: false}},
		{"llama2xs_model.bin", Config{Dim: 64, Hidden: 192, Layers: 5, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 512, Context: 256, Eps: 1e-5, RopeTheta: 10000, Tied: true}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			m := load(t, tc.file)
			if got := m.Config(); got != tc.want {
				t.Fatalf("Config = %+v\nwant     %+v", got, tc.want)
			}
			if m.Config().KVDim() != 32 {
				t.Fatalf("KVDim = %d, want 32", m.Config().KVDim())
			}
		})
	}
}

// TestLoadBadFile edits the header values or tensor table of a real file
// in memory; Load must refuse each with an error naming the problem.
func TestLoadBadFile(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	setU := func(key string, v uint32) func(*weights.File) {
		return func(f *weights.File) { f.Metadata.Set(key, weights.Uint32Value(v)) }
	}
	tensor := func(name string, fn func(*weights.Tensor)) func(*weights.File) {
		return func(f *weights.File) {
			tt, ok := f.Tensor(name)
			if !ok {
				t.Fatalf("%s has no tensor %s", path, name)
			}
			fn(tt)
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*weights.File)
		want string // a fragment the error must hold
	}{
		{"architecture", func(f *weights.File) { f.Metadata.Set("general.architecture", weights.StringValue("gpt2")) }, `"gpt2"`},
		{"missing key", func(f *weights.File) { f.Metadata.Delete("llama.block_count") }, "llama.block_count"},
		{"key of wrong type", func(f *weights.File) {
			f.Metadata.Set("llama.attention.head_count", weights.StringValue("8"))
		}, "llama.attention.head_count"},
		{"zero layers", setU("llama.block_count", 0), "llama.block_count"},
		{"huge dim", setU("llama.embedding_length", 1<<30), "llama.embedding_length"},
		{"dim disagrees with tensors", func(f *weights.File) {
			setU("llama.embedding_length", 32)(f)
			setU("llama.rope.dimension_count", 4)(f)
		}, "token_embd.weight"},
		{"hidden disagrees with tensors", setU("llama.feed_forward_length", 100), "ffn_gate"},
		{"more layers than tensors", setU("llama.block_count", 6), "blk.5"},
		{"fewer layers than tensors", setU("llama.block_count", 4), "belongs to layer 4, but llama.block_count = 4"},
		{"heads do not divide dim", setU("llama.attention.head_count", 7), "head count 7"},
		{"kv heads do not divide heads", setU("llama.attention.head_count_kv", 3), "KV head count 3"},
		{"kv heads disagree with attn_k", setU("llama.attention.head_count_kv", 8), "attn_k"},
		{"odd head dim", func(f *weights.File) {
			setU("llama.attention.head_count", 64)(f)
			setU("llama.attention.head_count_kv", 64)(f)
		}, "odd"},
		{"partial rope", setU("llama.rope.dimension_count", 4), "rope.dimension_count"},
		{"bad eps", func(f *weights.File) {
			f.Metadata.Set("llama.attention.layer_norm_rms_epsilon", weights.Float32Value(-1))
		}, "epsilon"},
		{"bad rope base", func(f *weights.File) { f.Metadata.Set("llama.rope.freq_base", weights.Float32Value(0)) }, "freq_base"},
		{"vocab size disagrees", setU("llama.vocab_size", 600), "vocab_size"},
		{"wrong tensor shape", tensor("blk.2.attn_q.weight", func(tt *weights.Tensor) { tt.Shape = []uint64{64, 32} }), "blk.2.attn_q.weight"},
		{"uncomputable type", tensor("blk.0.ffn_up.weight", func(tt *weights.Tensor) { tt.Type = weights.Q4_1 }), "Q4_1"},
		// The advice names the types it computes, not a command it lacks.
		{"uncomputable type's advice", tensor("token_embd.weight", func(tt *weights.Tensor) { tt.Type = weights.I8 }), "computes (BF16, F16, F32, Q4_0, Q4_K, Q6_K, Q8_0)"},
		{"short data", tensor("output.weight", func(tt *weights.Tensor) { tt.Data = tt.Data[:100] }), "output.weight"},
		{"unmapped data", tensor("blk.1.attn_norm.weight", func(tt *weights.Tensor) { tt.Data = nil }), "blk.1.attn_norm.weight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := weights.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			tc.edit(f)
			m, err := Load(f, Options{Threads: 1})
			if err == nil {
				m.Close()
				t.Fatal("Load accepted the file")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// TestLoadVocabularyOnly: a vocabulary-only GGUF given as a model is
// named as such, not as a model missing its first tensor.
func TestLoadVocabularyOnly(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "ggml-vocab-llama-spm.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m, err := Load(f, Options{Threads: 1}); err == nil || !strings.Contains(err.Error(), "vocabulary-only") {
		if m != nil {
			m.Close()
		}
		t.Errorf("Load of a vocabulary: %v, want it named vocabulary-only", err)
	}
}

// TestLoadBadThreads: a thread count outside 0..kernels.MaxThreads is an
// error, not a pool of 100000 spinning workers.
func TestLoadBadThreads(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{-1, kernels.MaxThreads + 1, 100000} {
		if m, err := Load(f, Options{Threads: n}); err == nil {
			m.Close()
			t.Errorf("Load with %d threads succeeded", n)
		} else if !strings.Contains(err.Error(), "threads") {
			t.Errorf("Load with %d threads: %v, want an error about the threads", n, err)
		}
	}
}

func TestNewCache(t *testing.T) {
	m := load(t, "llama2xs_model.bin")
	for _, ctx := range []int{-1, 257} {
		if _, err := m.NewCache(ctx, weights.F32); err == nil {
			t.Errorf("NewCache(%d) accepted a context outside 1..256", ctx)
		}
	}
	c, err := m.NewCache(0, weights.F16)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config(); got.Context != 256 || got.Layers != 5 || got.KVDim != 32 {
		t.Fatalf("NewCache(0) config %+v", got)
	}
}

func TestLogitsRow(t *testing.T) {
	var l Logits
	if l.Row(0) != nil || l.Row(-1) != nil {
		t.Fatal("empty Logits has a row")
	}
	if n := l.reset(3, []bool{false, true, true}); n != 2 {
		t.Fatalf("reset rows = %d, want 2", n)
	}
	copy(l.data, []float32{1, 2, 3, 4, 5, 6})
	if l.Row(0) != nil || l.Row(3) != nil {
		t.Fatal("slot without logits has a row")
	}
	if r := l.Row(2); len(r) != 3 || r[0] != 4 || cap(r) != 3 {
		t.Fatalf("Row(2) = %v (cap %d)", r, cap(r))
	}
}
