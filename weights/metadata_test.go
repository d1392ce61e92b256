package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestMetadataOrderAndReplace(t *testing.T) {
	var m Metadata // the zero value is usable
	m.Set("a", Uint32Value(1))
	m.Set("b", StringValue("x"))
	m.Set("c", Float32Value(2.5))
	m.Set("a", Uint32Value(7)) // replace keeps position
	var keys []string
	for _, kv := range m.All() {
		keys = append(keys, kv.Key)
	}
	if !slices.Equal(keys, []string{"a", "b", "c"}) {
		t.Fatalf("order = %v", keys)
	}
	if v, ok := m.Uint("a"); !ok || v != 7 {
		t.Errorf("a = %d %v", v, ok)
	}
	m.Delete("b")
	m.Delete("missing")
	if m.Len() != 2 {
		t.Fatalf("Len = %d after delete", m.Len())
	}
	if f, ok := m.Float("c"); !ok || f != 2.5 {
		t.Errorf("c after delete = %v %v (index not rebuilt?)", f, ok)
	}
	if _, ok := m.String("b"); ok {
		t.Error("deleted key still present")
	}
}

func TestValueConversions(t *testing.T) {
	tests := []struct {
		name string
		v    Value
		u    uint64
		uok  bool
		i    int64
		iok  bool
		f    float64
		fok  bool
	}{
		{"u8", Value{Type: TypeUint8, V: uint8(200)}, 200, true, 200, true, 200, true},
		{"i8 negative", Value{Type: TypeInt8, V: int8(-3)}, 0, false, -3, true, -3, true},
		{"i32", Int32Value(5), 5, true, 5, true, 5, true},
		{"u64 huge", Uint64Value(math.MaxUint64), math.MaxUint64, true, 0, false, math.MaxUint64, true},
		{"f32", Float32Value(0.5), 0, false, 0, false, 0.5, true},
		{"bool", BoolValue(true), 1, true, 0, false, 1, true},
		{"string", StringValue("s"), 0, false, 0, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, uok := tt.v.Uint()
			i, iok := tt.v.Int()
			f, fok := tt.v.Float()
			if u != tt.u || uok != tt.uok {
				t.Errorf("Uint = %d %v, want %d %v", u, uok, tt.u, tt.uok)
			}
			if i != tt.i || iok != tt.iok {
				t.Errorf("Int = %d %v, want %d %v", i, iok, tt.i, tt.iok)
			}
			if fok != tt.fok || (fok && f != tt.f) {
				t.Errorf("Float = %v %v, want %v %v", f, fok, tt.f, tt.fok)
			}
		})
	}
}

func TestMetadataArrays(t *testing.T) {
	var m Metadata
	m.Set("tokens", StringsValue([]string{"<unk>", "<s>", "</s>"}))
	m.Set("scores", Float32sValue([]float32{0, -1.5, 2}))
	m.Set("types", Int32sValue([]int32{2, 3, 3}))
	m.Set("wide", ArrayValue(TypeInt64, []Value{{Type: TypeInt64, V: int64(math.MaxInt32) + 1}}))
	m.Set("nested", ArrayValue(TypeArray, []Value{StringsValue([]string{"a"})}))

	if s, err := m.Strings("tokens"); err != nil || !slices.Equal(s, []string{"<unk>", "<s>", "</s>"}) {
		t.Errorf("Strings = %v, %v", s, err)
	}
	if f, err := m.Float32s("scores"); err != nil || !slices.Equal(f, []float32{0, -1.5, 2}) {
		t.Errorf("Float32s = %v, %v", f, err)
	}
	if i, err := m.Int32s("types"); err != nil || !slices.Equal(i, []int32{2, 3, 3}) {
		t.Errorf("Int32s = %v, %v", i, err)
	}
	if v, _ := m.Get("nested"); v.Len() != 1 {
		t.Errorf("nested Len = %d", v.Len())
	}
	errs := []struct {
		name string
		fn   func() error
		want string
	}{
		{"missing", func() error { _, err := m.Strings("nope"); return err }, "missing"},
		{"wrong elem", func() error { _, err := m.Strings("scores"); return err }, "want a string array"},
		{"not array", func() error { _, err := m.Int32s("x"); return err }, "missing"},
		{"too wide", func() error { _, err := m.Int32s("wide"); return err }, "want an int32"},
	}
	for _, e := range errs {
		if err := e.fn(); err == nil || !strings.Contains(err.Error(), e.want) {
			t.Errorf("%s: error = %v, want %q", e.name, err, e.want)
		}
	}
}

func TestFileTensorLookup(t *testing.T) {
	f := &File{Path: "m.gguf", Tensors: []Tensor{
		{Name: "token_embd.weight", Type: F32, Shape: []uint64{8, 32}},
		{Name: "output_norm.weight", Type: F32, Shape: []uint64{8}},
	}}
	if err := f.index(); err != nil {
		t.Fatal(err)
	}
	if r, c := f.Tensors[0].Rows(); r != 32 || c != 8 {
		t.Errorf("Rows = %d, %d", r, c)
	}
	if _, err := f.TensorShaped("token_embd.weight", 8, 32); err != nil {
		t.Error(err)
	}
	if _, err := f.TensorShaped("token_embd.weight", 32, 8); err == nil || !strings.Contains(err.Error(), "want [32 8]") {
		t.Errorf("wrong shape error = %v", err)
	}
	if _, err := f.TensorShaped("output.weight", 8, 32); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing tensor error = %v", err)
	}
	f.Tensors = append(f.Tensors, Tensor{Name: "output_norm.weight"})
	if err := f.index(); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate error = %v", err)
	}
}

// TestMetadataValuesAreBounded: byte arrays whose decoded values would
// take gigabytes are refused before they are allocated, alone or once
// the file's arrays together pass the bound.
func TestMetadataValuesAreBounded(t *testing.T) {
	gguf := func(lengths ...uint64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, GGUFMagic)
		b = binary.LittleEndian.AppendUint32(b, 3)
		b = binary.LittleEndian.AppendUint64(b, 0) // tensors
		b = binary.LittleEndian.AppendUint64(b, uint64(len(lengths)))
		for i, n := range lengths {
			key := fmt.Sprintf("x.bytes%d", i)
			b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
			b = append(b, key...)
			b = binary.LittleEndian.AppendUint32(b, uint32(TypeArray))
			b = binary.LittleEndian.AppendUint32(b, uint32(TypeUint8))
			b = binary.LittleEndian.AppendUint64(b, n)
			b = append(b, make([]byte, n)...)
		}
		return b
	}
	for _, lengths := range [][]uint64{{maxMetadataValues + 1}, {1000, maxMetadataValues - 999}} {
		_, err := Parse(gguf(lengths...), "big.gguf")
		var fe *FormatError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "more than") {
			t.Errorf("arrays of %v bytes: %v, want a format error saying the arrays hold too many values", lengths, err)
		}
	}
	if f, err := Parse(gguf(1000, 1000), "small.gguf"); err != nil || len(f.Metadata.All()) != 2 {
		t.Errorf("two small arrays: %v", err)
	}
}
