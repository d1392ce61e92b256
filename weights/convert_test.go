package weights

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

func convertToBytes(t *testing.T, src *File, opt ConvertOptions) *File {
	t.Helper()
	var buf bytes.Buffer
	if err := Convert(src, &buf, opt); err != nil {
		t.Fatal(err)
	}
	f, err := ParseGGUF(buf.Bytes(), "converted.gguf")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Converting stories260K.bin gives the tensors of the published
// stories260K.gguf, byte for byte.
func TestConvertLlama2CMatchesReferenceGGUF(t *testing.T) {
	bin, err := Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	ref, err := Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var tok Metadata
	for _, kv := range ref.Metadata.All() {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			tok.Set(kv.Key, kv.Value)
		}
	}
	got := convertToBytes(t, bin, ConvertOptions{Tokenizer: &tok})
	if len(got.Tensors) != len(ref.Tensors)-1 {
		t.Errorf("%d tensors, want %d (the reference's untied output copy is absent)", len(got.Tensors), len(ref.Tensors)-1)
	}
	for _, rt := range ref.Tensors {
		name := rt.Name
		if name == "output.weight" {
			name = "token_embd.weight" // llama2.c ties the classifier
		}
		gt, err := got.TensorShaped(name, rt.Shape...)
		if err != nil {
			t.Error(err)
			continue
		}
		if gt.Type != rt.Type || !bytes.Equal(gt.Data, rt.Data) {
			t.Errorf("%s: not byte-identical to the reference %s", name, rt.Name)
		}
	}
	for _, k := range []string{"general.architecture", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
		"llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
		"llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id"} {
		a, _ := got.Metadata.Get(k)
		b, _ := ref.Metadata.Get(k)
		if a != b {
			t.Errorf("%s = %v, reference %v", k, a, b)
		}
	}
	if ft, _ := got.Metadata.Uint("general.file_type"); ft != uint64(FileTypeAllF32) {
		t.Errorf("general.file_type %d", ft)
	}
}

func TestConvertQuantizes(t *testing.T) {
	bin, err := Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	emb, _ := bin.Tensor("token_embd.weight")
	want := make([]float32, emb.Elements())
	Dequantize(F32, emb.Data, want)
	// Worst-case relative error of a block quantizer, measured against the
	// largest weight in the tensor.
	bound := map[DType]float64{F16: 1e-3, BF16: 8e-3, Q8_0: 8e-3, Q4_0: 0.15}
	for _, typ := range []DType{F16, BF16, Q8_0, Q4_0} {
		t.Run(typ.String(), func(t *testing.T) {
			var fallbacks []string
			f := convertToBytes(t, bin, ConvertOptions{Type: typ, Fallback: func(name string, _ uint64, to DType) {
				fallbacks = append(fallbacks, name)
			}})
			if ft, _ := f.Metadata.Uint("general.file_type"); ft == 0 && typ != F32 {
				t.Error("general.file_type not set")
			}
			for _, ts := range f.Tensors {
				switch {
				case len(ts.Shape) == 1 && ts.Type != F32:
					t.Errorf("norm %s became %s", ts.Name, ts.Type)
				case strings.Contains(ts.Name, "ffn_down") && typ.BlockSize() > 1:
					// 172-long rows are not a block multiple: F16 fallback.
					if ts.Type != F16 {
						t.Errorf("%s is %s, want the F16 fallback", ts.Name, ts.Type)
					}
				case len(ts.Shape) == 2 && ts.Type != typ:
					t.Errorf("%s is %s, want %s", ts.Name, ts.Type, typ)
				}
			}
			if typ.BlockSize() > 1 && len(fallbacks) != 5 {
				t.Errorf("%d fallbacks reported, want the 5 ffn_down matrices: %v", len(fallbacks), fallbacks)
			}
			ce, _ := f.Tensor("token_embd.weight")
			got := make([]float32, ce.Elements())
			if err := Dequantize(ce.Type, ce.Data, got); err != nil {
				t.Fatal(err)
			}
			var maxErr, maxAbs float64
			for i := range want {
				maxErr = math.Max(maxErr, math.Abs(float64(got[i]-want[i])))
				maxAbs = math.Max(maxAbs, math.Abs(float64(want[i])))
			}
			if maxErr > bound[typ]*maxAbs {
				t.Errorf("max error %.3g is more than %.3g of the largest weight %.3g", maxErr, bound[typ], maxAbs)
			}
		})
	}
}

func TestConvertRejects(t *testing.T) {
	bin, err := Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	if err := Convert(bin, &bytes.Buffer{}, ConvertOptions{Type: Q4_K}); err == nil || !strings.Contains(err.Error(), "q4_0") {
		t.Errorf("Q4_K target: %v", err)
	}
	out := filepath.Join(t.TempDir(), "x.gguf")
	err = WriteGGUF(out, nil, []TensorInfo{{Name: "a", Type: F32, Shape: []uint64{2}}}, func(int, io.Writer) error { return nil })
	if err == nil {
		t.Error("empty data callback succeeded")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Error("a failed write left the output file")
	}
}
