package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// everyValue holds one value of each metadata type, nested arrays included.
func everyValue() *Metadata {
	md := &Metadata{}
	md.Set("u8", Value{Type: TypeUint8, V: uint8(200)})
	md.Set("i8", Value{Type: TypeInt8, V: int8(-100)})
	md.Set("u16", Value{Type: TypeUint16, V: uint16(60000)})
	md.Set("i16", Value{Type: TypeInt16, V: int16(-30000)})
	md.Set("u32", Uint32Value(4000000000))
	md.Set("i32", Int32Value(-2000000000))
	md.Set("f32", Float32Value(1.5e-5))
	md.Set("bool.t", BoolValue(true))
	md.Set("bool.f", BoolValue(false))
	md.Set("str", StringValue("héllo ▁wörld"))
	md.Set("empty", StringValue(""))
	md.Set("u64", Uint64Value(math.MaxUint64))
	md.Set("i64", Value{Type: TypeInt64, V: int64(math.MinInt64)})
	md.Set("f64", Value{Type: TypeFloat64, V: math.Pi})
	md.Set("strs", StringsValue([]string{"a", "", "▁b"}))
	md.Set("f32s", Float32sValue([]float32{1, -2, 3.25}))
	md.Set("nested", ArrayValue(TypeArray, []Value{
		Int32sValue([]int32{1, 2}),
		ArrayValue(TypeArray, []Value{StringsValue([]string{"deep"})}),
		Int32sValue(nil),
	}))
	return md
}

func writeTestGGUF(t *testing.T, md *Metadata, infos []TensorInfo, fill func(i int) []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	g, err := NewGGUFWriter(&buf, md, infos)
	if err != nil {
		t.Fatal(err)
	}
	for i := range infos {
		if _, err := g.Write(fill(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestGGUFRoundTrip(t *testing.T) {
	md := everyValue()
	infos := []TensorInfo{
		{Name: "a", Type: F32, Shape: []uint64{3, 2}},
		{Name: "b", Type: Q8_0, Shape: []uint64{64}},
		{Name: "c", Type: F16, Shape: []uint64{5, 1, 1, 1}},
	}
	fill := func(i int) []byte {
		n, _ := infos[i].Bytes()
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		return p
	}
	data := writeTestGGUF(t, md, infos, fill)
	f, err := ParseGGUF(data, "mem.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 32 || f.DataOffset%32 != 0 {
		t.Errorf("version %d alignment %d data offset %d", f.Version, f.Alignment, f.DataOffset)
	}
	if !reflect.DeepEqual(f.Metadata.All(), md.All()) {
		t.Errorf("metadata differs after round trip:\n got %v\nwant %v", f.Metadata.All(), md.All())
	}
	for i, want := range infos {
		got := f.Tensors[i]
		if got.Name != want.Name || got.Type != want.Type || !reflect.DeepEqual(got.Shape, want.Shape) {
			t.Errorf("tensor %d: %+v, want %+v", i, got, want)
		}
		if got.Offset%32 != 0 || !bytes.Equal(got.Data, fill(i)) {
			t.Errorf("tensor %s: offset %d, data mismatch", got.Name, got.Offset)
		}
	}
	// Writing what was read gives the same bytes.
	again := writeTestGGUF(t, &f.Metadata, infos, fill)
	if !bytes.Equal(again, data) {
		t.Error("rewrite of a parsed file is not byte-identical")
	}
}

func TestGGUFCustomAlignment(t *testing.T) {
	md := &Metadata{}
	md.Set("general.alignment", Uint32Value(64))
	infos := []TensorInfo{{Name: "x", Type: F32, Shape: []uint64{3}}, {Name: "y", Type: F32, Shape: []uint64{5}}}
	data := writeTestGGUF(t, md, infos, func(i int) []byte { n, _ := infos[i].Bytes(); return make([]byte, n) })
	f, err := ParseGGUF(data, "a.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 64 || f.Tensors[1].Offset-f.Tensors[0].Offset != 64 {
		t.Errorf("alignment %d, offsets %d %d", f.Alignment, f.Tensors[0].Offset, f.Tensors[1].Offset)
	}
}

func TestGGUFWriterErrors(t *testing.T) {
	one := []TensorInfo{{Name: "x", Type: F32, Shape: []uint64{4}}}
	tests := []struct {
		name  string
		md    func() *Metadata
		infos []TensorInfo
		want  string
	}{
		{"duplicate", nil, []TensorInfo{one[0], one[0]}, "duplicate tensor name"},
		{"block", nil, []TensorInfo{{Name: "q", Type: Q4_0, Shape: []uint64{31}}}, "multiple"},
		{"no dims", nil, []TensorInfo{{Name: "q", Type: F32}}, "0 dimensions"},
		{"bad alignment", func() *Metadata { m := &Metadata{}; m.Set("general.alignment", Uint32Value(3)); return m }, one, "power-of-two"},
		{"bad value", func() *Metadata { m := &Metadata{}; m.Set("k", Value{Type: TypeUint32, V: "x"}); return m }, one, `"k"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var md *Metadata
			if tc.md != nil {
				md = tc.md()
			}
			_, err := NewGGUFWriter(io.Discard, md, tc.infos)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	g, err := NewGGUFWriter(io.Discard, nil, one)
	if err != nil {
		t.Fatal(err)
	}
	g.Write(make([]byte, 10))
	if err := g.Close(); err == nil || !strings.Contains(err.Error(), "10 of 16 bytes") {
		t.Errorf("short tensor: %v", err)
	}
	if _, err := g.Write(make([]byte, 7)); err == nil {
		t.Error("writing past the declared tensors succeeded")
	}
}

func TestWriteGGUFIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	infos := []TensorInfo{{Name: "x", Type: F32, Shape: []uint64{4}}}
	err := WriteGGUF(path, nil, infos, func(i int, w io.Writer) error { _, err := w.Write(make([]byte, 8)); return err })
	if err == nil || !strings.Contains(err.Error(), "8 of 16") {
		t.Fatalf("short callback: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("failed write left %d files behind", len(ents))
	}
	err = WriteGGUF(path, nil, infos, func(i int, w io.Writer) error { _, err := w.Write(make([]byte, 16)); return err })
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if x, ok := f.Tensor("x"); !ok || len(x.Data) != 16 {
		t.Errorf("tensor x: %v %v", x, ok)
	}
}

// header builds GGUF bytes by hand for the bad-input cases.
type header struct{ b []byte }

func (h *header) u32(v uint32) *header  { h.b = binary.LittleEndian.AppendUint32(h.b, v); return h }
func (h *header) u64(v uint64) *header  { h.b = binary.LittleEndian.AppendUint64(h.b, v); return h }
func (h *header) str(s string) *header  { h.u64(uint64(len(s))); h.b = append(h.b, s...); return h }
func (h *header) raw(p ...byte) *header { h.b = append(h.b, p...); return h }

func start(tensors, kvs uint64) *header {
	return (&header{}).u32(GGUFMagic).u32(3).u64(tensors).u64(kvs)
}

// tensorInfo appends a tensor info; data of size bytes follows later.
func (h *header) tensorInfo(name string, typ DType, offset uint64, shape ...uint64) *header {
	h.str(name).u32(uint32(len(shape)))
	for _, d := range shape {
		h.u64(d)
	}
	return h.u32(uint32(typ)).u64(offset)
}

func (h *header) data(n int) []byte {
	for len(h.b)%32 != 0 {
		h.b = append(h.b, 0)
	}
	return append(h.b, make([]byte, n)...)
}

func TestGGUFBadInput(t *testing.T) {
	good := start(1, 1).str("k").u32(uint32(TypeUint32)).u32(7).tensorInfo("w", F32, 0, 4, 2).data(32)
	if _, err := ParseGGUF(good, "good.gguf"); err != nil {
		t.Fatalf("the baseline file must parse: %v", err)
	}
	tests := []struct {
		name string
		data []byte
		want []string // substrings of the error
	}{
		{"empty", nil, []string{"bad.gguf", "offset 0", "magic", "truncated"}},
		{"wrong magic", []byte("GGUX\x03\x00\x00\x00"), []string{"magic", "not a GGUF"}},
		{"version 1", (&header{}).u32(GGUFMagic).u32(1).b, []string{"offset 4", "v1"}},
		{"version 99", (&header{}).u32(GGUFMagic).u32(99).u64(0).u64(0).b, []string{"version 99"}},
		{"big endian", (&header{}).u32(GGUFMagic).u32(3 << 24).b, []string{"big-endian"}},
		{"version 0", (&header{}).u32(GGUFMagic).u32(0).u64(0).u64(0).b, []string{"unsupported GGUF version 0 (want 2 or 3)"}},
		{"truncated header", good[:30], []string{"truncated"}},
		{"truncated in tensor info", good[:60], []string{"tensor 0", "truncated"}},
		{"huge tensor count", start(1<<60, 0).b, []string{"tensor_count", "cannot fit"}},
		{"huge kv count", start(0, 1<<60).b, []string{"metadata_kv_count", "cannot fit"}},
		{"string past EOF", start(0, 1).u64(1 << 40).raw(make([]byte, 16)...).b, []string{"metadata entry 0 key", "past the end"}},
		{"key not utf8", start(0, 1).str("\xff\xfe").u32(uint32(TypeUint8)).raw(1).b, []string{"key", "UTF-8"}},
		{"bad bool", start(0, 1).str("b").u32(uint32(TypeBool)).raw(2).b, []string{`"b"`, "bool"}},
		{"unknown value type", start(0, 1).str("v").u32(99).raw(make([]byte, 16)...).b, []string{`"v"`, "unknown metadata value type 99"}},
		{"huge array", start(0, 1).str("a").u32(uint32(TypeArray)).u32(uint32(TypeUint64)).u64(1 << 58).b, []string{`"a"`, "array length", "cannot fit"}},
		{"duplicate key", start(0, 2).str("k").u32(uint32(TypeUint8)).raw(1).str("k").u32(uint32(TypeUint8)).raw(1).b, []string{"duplicate key"}},
		{"bad alignment", start(0, 1).str("general.alignment").u32(uint32(TypeUint32)).u32(48).b, []string{"general.alignment", "power-of-two"}},
		{"unknown tensor type", start(1, 0).tensorInfo("w", DType(77), 0, 4).data(16), []string{"tensor 0 (w) type", "unknown tensor type 77"}},
		{"zero dims", start(1, 0).str("w").u32(0).data(0), []string{"n_dims", "0 dimensions"}},
		{"five dims", start(1, 0).str("w").u32(5).data(0), []string{"n_dims", "5 dimensions"}},
		{"overflowing shape", start(1, 0).tensorInfo("w", F32, 0, 1<<32, 1<<32).data(0), []string{"dim 1", "overflows"}},
		{"zero dim", start(1, 0).tensorInfo("w", F32, 0, 4, 0).data(0), []string{"dim 1", "zero"}},
		{"row not a block multiple", start(1, 0).tensorInfo("w", Q4_0, 0, 33).data(64), []string{"tensor 0 (w) shape", "multiple"}},
		{"misaligned offset", start(1, 0).tensorInfo("w", F32, 4, 4).data(64), []string{"tensor 0 (w) offset", "alignment"}},
		{"data past EOF", start(1, 0).tensorInfo("w", F32, 0, 4, 2).data(31), []string{"tensor 0 (w) offset", "past the end"}},
		{"offset past EOF", start(1, 0).tensorInfo("w", F32, 1<<62, 4).data(16), []string{"past the end"}},
		{"duplicate tensor", start(2, 0).tensorInfo("w", F32, 0, 4).tensorInfo("w", F32, 32, 4).data(64), []string{`duplicate tensor name "w"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseGGUF(tc.data, "bad.gguf")
			if err == nil {
				t.Fatalf("parsed %d tensors, want an error", len(f.Tensors))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), "bad.gguf") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.gguf")
	os.WriteFile(empty, nil, 0o644)
	junk := filepath.Join(dir, "junk.bin")
	os.WriteFile(junk, []byte("this is not a model file at all, just some text"), 0o644)
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.gguf"), "no such file"},
		{dir, "is a directory"},
		{empty, "is empty"},
		{junk, "not a GGUF file"},
	} {
		_, err := Open(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s): %v, want %q", tc.path, err, tc.want)
		}
	}
	var fe *FormatError
	if _, err := Open(junk); !errors.As(err, &fe) {
		t.Errorf("junk file error %T is not a *FormatError", err)
	}
}

func TestOpenRealGGUF(t *testing.T) {
	tests := []struct {
		file    string
		tensors int
		arch    string
		keys    map[string]uint64
		types   map[DType]int
	}{
		{"stories260K.gguf", 48, "llama", map[string]uint64{"llama.embedding_length": 64, "llama.block_count": 5,
			"llama.feed_forward_length": 172, "llama.attention.head_count": 8, "llama.attention.head_count_kv": 4,
			"llama.rope.dimension_count": 8, "llama.context_length": 2048}, map[DType]int{F32: 48}},
		{"llama-2-tiny-random.gguf", 12, "llama", map[string]uint64{"llama.embedding_length": 8, "llama.block_count": 1,
			"llama.feed_forward_length": 32, "general.file_type": 1}, map[DType]int{F16: 9, F32: 3}},
		{"ggml-vocab-llama-spm.gguf", 0, "llama", map[string]uint64{"tokenizer.ggml.bos_token_id": 1,
			"tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}, nil},
		{"ggml-vocab-gpt-2.gguf", 0, "gpt2", map[string]uint64{"tokenizer.ggml.bos_token_id": 50256}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f, err := Open(testutil.Model(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != tc.tensors || f.Architecture() != tc.arch || f.Version != 3 {
				t.Errorf("%d tensors, arch %q, version %d", len(f.Tensors), f.Architecture(), f.Version)
			}
			for k, want := range tc.keys {
				if got, ok := f.Metadata.Uint(k); !ok || got != want {
					t.Errorf("%s = %d (%v), want %d", k, got, ok, want)
				}
			}
			types := map[DType]int{}
			for _, ts := range f.Tensors {
				types[ts.Type]++
				if uint64(len(ts.Data)) != ts.Size || ts.Offset+ts.Size > uint64(f.Size) {
					t.Errorf("tensor %s: %d data bytes, size %d, offset %d", ts.Name, len(ts.Data), ts.Size, ts.Offset)
				}
			}
			if tc.types != nil && !reflect.DeepEqual(types, tc.types) {
				t.Errorf("tensor types %v, want %v", types, tc.types)
			}
		})
	}
	f, err := Open(testutil.Model(t, "ggml-vocab-gpt-2.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	toks, err := f.Metadata.Strings("tokenizer.ggml.tokens")
	merges, err2 := f.Metadata.Strings("tokenizer.ggml.merges")
	if err != nil || err2 != nil || len(toks) != 50257 || len(merges) != 50000 {
		t.Errorf("gpt-2 vocab: %d tokens, %d merges (%v %v)", len(toks), len(merges), err, err2)
	}
}

func TestRealFileRewriteIsIdentical(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseGGUF(orig, path)
	if err != nil {
		t.Fatal(err)
	}
	infos := make([]TensorInfo, len(f.Tensors))
	for i, ts := range f.Tensors {
		infos[i] = TensorInfo{Name: ts.Name, Type: ts.Type, Shape: ts.Shape}
	}
	out := writeTestGGUF(t, &f.Metadata, infos, func(i int) []byte { return f.Tensors[i].Data })
	if !bytes.Equal(out, orig) {
		t.Errorf("rewriting stories260K.gguf changed it (%d bytes vs %d)", len(out), len(orig))
	}
}

// TestWriteGGUFRefusesWhatCannotFit: a file larger than the disk's free
// space fails before any data is written (an inflated shape once filled
// a disk for an hour), and a directory at the path is named as such;
// neither leaves anything behind.
func TestWriteGGUFRefusesWhatCannotFit(t *testing.T) {
	dir := t.TempDir()
	if free, ok := diskFree(dir); ok { // on unix, TestDiskFreeReads
		called := false
		huge := []TensorInfo{{Name: "x", Type: F32, Shape: []uint64{free/4 + 1<<20}}}
		err := WriteGGUF(filepath.Join(dir, "m.gguf"), nil, huge, func(int, io.Writer) error { called = true; return nil })
		if err == nil || !strings.Contains(err.Error(), "free") || called {
			t.Errorf("a %d-byte file on a disk with %d free: %v (data written: %v); want a refusal up front", free+4<<20, free, err, called)
		}
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	one := []TensorInfo{{Name: "x", Type: F32, Shape: []uint64{4}}}
	err := WriteGGUF(sub, nil, one, func(_ int, w io.Writer) error { _, err := w.Write(make([]byte, 16)); return err })
	if err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("writing over a directory: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}
