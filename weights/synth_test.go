package weights

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSynthDeterministicAndLoadable(t *testing.T) {
	dir := t.TempDir()
	sh, err := ParseDims("64,96,2,4,2,300")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []DType{F32, F16, Q8_0, Q4_0} {
		a, b := filepath.Join(dir, typ.String()+"a.gguf"), filepath.Join(dir, typ.String()+"b.gguf")
		for _, p := range []string{a, b} {
			if err := Synth(p, SynthOptions{Shape: sh, Type: typ, Seed: 7}); err != nil {
				t.Fatal(err)
			}
		}
		ba, _ := os.ReadFile(a)
		bb, _ := os.ReadFile(b)
		if !bytes.Equal(ba, bb) {
			t.Errorf("%s: same seed gave different files", typ)
		}
		f, err := Open(a)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Tensors) != 2+9*2+1 {
			t.Errorf("%d tensors", len(f.Tensors))
		}
		q, _ := f.Tensor("blk.1.attn_k.weight")
		down, _ := f.Tensor("blk.0.ffn_down.weight")
		if q.Type != typ || q.Shape[1] != 32 {
			t.Errorf("attn_k: %s %v", q.Type, q.Shape)
		}
		if typ.BlockSize() > 1 && down.Type != typ { // 96 is a multiple of 32
			t.Errorf("ffn_down: %s", down.Type)
		}
		vals := make([]float32, q.Elements())
		Dequantize(q.Type, q.Data, vals)
		var mean, sq float64
		for _, v := range vals {
			mean += float64(v)
			sq += float64(v) * float64(v)
		}
		mean /= float64(len(vals))
		std := sq/float64(len(vals)) - mean*mean
		if std < 0.015*0.015 || std > 0.025*0.025 || mean > 0.005 || mean < -0.005 {
			t.Errorf("%s weights: mean %.4f variance %.6f, want about 0 and 0.0004", typ, mean, std)
		}
		f.Close()
	}
	if err := Synth(filepath.Join(dir, "c.gguf"), SynthOptions{Shape: sh, Type: Q4_0, Seed: 8}); err != nil {
		t.Fatal(err)
	}
	c, _ := os.ReadFile(filepath.Join(dir, "c.gguf"))
	a, _ := os.ReadFile(filepath.Join(dir, "Q4_0a.gguf"))
	if bytes.Equal(a, c) {
		t.Error("different seeds gave the same file")
	}
}

func TestSynthErrors(t *testing.T) {
	dir := t.TempDir()
	sh, _ := LookupShape("stories15m")
	err := Synth(filepath.Join(dir, "x.gguf"), SynthOptions{Shape: sh, Type: F32, Vocab: ByteVocab(512)})
	if err == nil || !strings.Contains(err.Error(), "512 tokens") || !strings.Contains(err.Error(), "32000") {
		t.Errorf("vocab mismatch: %v", err)
	}
	// Without a real vocabulary the byte vocabulary needs its 260 tokens:
	// fewer lost bytes, and with them text it could encode.
	small, err := ParseDims("64,172,4,8,4,100")
	if err != nil {
		t.Fatal(err)
	}
	if err := Synth(filepath.Join(dir, "s.gguf"), SynthOptions{Shape: small, Type: F32}); err == nil || !strings.Contains(err.Error(), "260") {
		t.Errorf("a byte vocabulary of 100 tokens: %v", err)
	}
	if _, err := ParseDims("64,96,2,3,1,300"); err == nil {
		t.Error("heads not dividing dim accepted")
	}
	if _, err := LookupShape("gpt-5"); err == nil || !strings.Contains(err.Error(), "tinyllama-1.1b") {
		t.Errorf("unknown shape: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("failed synth left %d files", len(ents))
	}
}

func TestShapesFacts(t *testing.T) {
	s, err := LookupShape("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	var params uint64
	for _, ti := range s.Tensors(F32) {
		n, _ := ti.Bytes()
		params += n / 4
	}
	// TinyLlama 1.1B has 1,100,048,384 parameters.
	if params != 1100048384 {
		t.Errorf("tinyllama-1.1b: %d parameters", params)
	}
	s, _ = LookupShape("llama2-7b")
	params = 0
	for _, ti := range s.Tensors(F32) {
		n, _ := ti.Bytes()
		params += n / 4
	}
	if params != 6738415616 { // Llama 2 7B
		t.Errorf("llama2-7b: %d parameters", params)
	}
}
