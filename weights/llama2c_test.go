package weights

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// llama2CBytes builds a llama2.c file whose float i holds float32(i), so
// every tensor's position can be checked.
func llama2CBytes(hdr [7]int32, floats int) []byte {
	b := make([]byte, 0, 28+4*floats)
	for _, v := range hdr {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	for i := 0; i < floats; i++ {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(i)))
	}
	return b
}

func TestLlama2CLayout(t *testing.T) {
	// dim 8, hidden 12, 2 layers, 2 heads, 1 kv head, vocab 5, seq 3.
	dim, hid, L, kv, vocab, seq := 8, 12, 2, 4, 5, 3
	tied := vocab*dim + L*dim + L*dim*dim + 2*L*kv*dim + L*dim*dim + L*dim + 3*L*hid*dim + dim + 2*seq*2
	for _, untied := range []bool{false, true} {
		n, v := tied, int32(vocab)
		if untied {
			n, v = tied+vocab*dim, -v
		}
		f, err := ParseLlama2C(llama2CBytes([7]int32{8, 12, 2, 2, 1, v, 3}, n), "m.bin")
		if err != nil {
			t.Fatal(err)
		}
		first := func(name string) float32 {
			ts, ok := f.Tensor(name)
			if !ok {
				t.Fatalf("untied=%v: no tensor %s", untied, name)
			}
			return math.Float32frombits(binary.LittleEndian.Uint32(ts.Data))
		}
		// Expected first float index of each tensor in llama2.c order.
		at := map[string]int{
			"token_embd.weight":        0,
			"blk.0.attn_norm.weight":   vocab * dim,
			"blk.1.attn_norm.weight":   vocab*dim + dim,
			"blk.0.attn_q.weight":      vocab*dim + L*dim,
			"blk.1.attn_k.weight":      vocab*dim + L*dim + L*dim*dim + kv*dim,
			"blk.0.ffn_gate.weight":    vocab*dim + 2*L*dim + 2*L*dim*dim + 2*L*kv*dim,
			"blk.1.ffn_up.weight":      vocab*dim + 2*L*dim + 2*L*dim*dim + 2*L*kv*dim + 2*L*hid*dim + hid*dim,
			"output_norm.weight":       tied - dim - 2*seq*2,
			"blk.1.attn_output.weight": vocab*dim + L*dim + L*dim*dim + 2*L*kv*dim + dim*dim,
		}
		if untied {
			at["output.weight"] = tied
		} else if _, ok := f.Tensor("output.weight"); ok {
			t.Error("tied model has an output.weight")
		}
		for name, idx := range at {
			if got := first(name); got != float32(idx) {
				t.Errorf("untied=%v: %s starts at float %v, want %d", untied, name, got, idx)
			}
		}
		if ts, _ := f.Tensor("blk.1.ffn_down.weight"); ts.Shape[0] != uint64(hid) || ts.Shape[1] != uint64(dim) {
			t.Errorf("ffn_down shape %v, want [%d %d]", ts.Shape, hid, dim)
		}
		if ts, _ := f.Tensor("blk.0.attn_k.weight"); ts.Shape[0] != uint64(dim) || ts.Shape[1] != uint64(kv) {
			t.Errorf("attn_k shape %v, want [%d %d]", ts.Shape, dim, kv)
		}
	}
}

func TestLlama2CBadInput(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want []string
	}{
		{"short header", []byte{1, 2, 3}, []string{"offset 0", "truncated"}},
		{"zero dim", llama2CBytes([7]int32{0, 12, 2, 2, 1, 5, 3}, 10), []string{"dim", "out of range"}},
		{"negative layers", llama2CBytes([7]int32{8, 12, -2, 2, 1, 5, 3}, 10), []string{"n_layers", "out of range"}},
		{"heads do not divide dim", llama2CBytes([7]int32{8, 12, 2, 3, 1, 5, 3}, 10), []string{"n_heads"}},
		{"kv heads do not divide heads", llama2CBytes([7]int32{8, 12, 2, 2, 3, 5, 3}, 10), []string{"n_kv_heads"}},
		{"wrong size", llama2CBytes([7]int32{8, 12, 2, 2, 1, 5, 3}, 10), []string{"describes a", "the file has 68 bytes", "cut short"}},
		{"too long", append(llama2CBytes([7]int32{8, 12, 2, 2, 1, 5, 3}, 10), make([]byte, 8192)...), []string{"llama2.c header:", "the file has 8260 bytes"}},
		{"huge", llama2CBytes([7]int32{1 << 24, 1 << 24, 1 << 24, 2, 1, 5, 3}, 10), []string{"more bytes than any file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseLlama2C(tc.data, "bad.bin")
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(tc.want, "bad.bin") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestOpenRealLlama2C(t *testing.T) {
	tests := []struct {
		file                 string
		hidden, ctx, tensors uint64
	}{
		{"stories260K.bin", 172, 512, 47},
		{"llama2xs_model.bin", 192, 256, 47},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f, err := Open(testutil.Model(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Format != FormatLlama2C || uint64(len(f.Tensors)) != tc.tensors {
				t.Errorf("format %s, %d tensors", f.Format, len(f.Tensors))
			}
			for k, want := range map[string]uint64{"llama.embedding_length": 64, "llama.feed_forward_length": tc.hidden,
				"llama.block_count": 5, "llama.attention.head_count": 8, "llama.attention.head_count_kv": 4,
				"llama.context_length": tc.ctx, "llama.rope.dimension_count": 8} {
				if got, _ := f.Metadata.Uint(k); got != want {
					t.Errorf("%s = %d, want %d", k, got, want)
				}
			}
		})
	}
}

// TestOpenCutShortLlama2C: a real .bin cut short is reported as that, not
// as a file of no known format.
func TestOpenCutShortLlama2C(t *testing.T) {
	data, err := os.ReadFile(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{len(data) / 10, len(data) - 1} {
		path := filepath.Join(t.TempDir(), "stories.bin")
		if err := os.WriteFile(path, data[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the file has %d bytes: the file is cut short", n)) ||
			strings.Contains(err.Error(), "not a llama2.c") {
			t.Errorf("%d of %d bytes: %v; want it called cut short", n, len(data), err)
		}
	}
}

// The llama2.c and GGUF versions of stories260K hold the same bytes.
func TestLlama2CMatchesGGUF(t *testing.T) {
	bin, err := Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	gg, err := Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer gg.Close()
	for _, bt := range bin.Tensors {
		gt, err := gg.TensorShaped(bt.Name, bt.Shape...)
		if err != nil {
			t.Error(err)
			continue
		}
		if !bytes.Equal(bt.Data, gt.Data) {
			t.Errorf("%s differs between the .bin and the .gguf", bt.Name)
		}
	}
}

func FuzzParseLlama2C(f *testing.F) {
	for _, name := range []string{"stories260K.bin", "llama2xs_model.bin"} {
		if b, err := os.ReadFile(testutil.Model(f, name)); err == nil {
			f.Add(b[:28])
			f.Add(b)
		}
	}
	f.Add(llama2CBytes([7]int32{8, 12, 2, 2, 1, 5, 3}, 10))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseLlama2C(data, "fuzz.bin")
		if err != nil {
			return
		}
		checkConsistent(t, m, data)
	})
}

func FuzzParseGGUF(f *testing.F) {
	for _, name := range []string{"stories260K.gguf", "llama-2-tiny-random.gguf"} {
		if b, err := os.ReadFile(testutil.Model(f, name)); err == nil {
			f.Add(b[:4096])
			f.Add(b[:20000])
		}
	}
	f.Add(start(1, 1).str("k").u32(uint32(TypeUint32)).u32(7).tensorInfo("w", F32, 0, 4, 2).data(32))
	f.Add(start(0, 1).str("n").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(1).u32(uint32(TypeString)).u64(1).str("x").b)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseGGUF(data, "fuzz.gguf")
		if err != nil {
			return
		}
		checkConsistent(t, m, data)
	})
}

// checkConsistent asserts what every successfully parsed file promises.
func checkConsistent(t *testing.T, f *File, data []byte) {
	t.Helper()
	for _, ts := range f.Tensors {
		if ts.Offset+ts.Size > uint64(len(data)) || uint64(len(ts.Data)) != ts.Size {
			t.Fatalf("tensor %s: [%d,+%d) outside a %d-byte file", ts.Name, ts.Offset, ts.Size, len(data))
		}
		if _, ok := f.Tensor(ts.Name); !ok {
			t.Fatalf("tensor %s is not indexed", ts.Name)
		}
		if _, err := (TensorInfo{Name: ts.Name, Type: ts.Type, Shape: ts.Shape}).Bytes(); err != nil {
			t.Fatalf("accepted an invalid tensor: %v", err)
		}
	}
}
