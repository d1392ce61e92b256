package weights

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestDTypeSizes(t *testing.T) {
	// Block layouts from the GGUF/ggml definitions: bytes per block and
	// elements per block.
	tests := []struct {
		t            DType
		block, bytes int
	}{
		{F32, 1, 4}, {F16, 1, 2}, {BF16, 1, 2},
		{Q4_0, 32, 18}, {Q4_1, 32, 20}, {Q5_0, 32, 22}, {Q5_1, 32, 24},
		{Q8_0, 32, 34}, {Q8_1, 32, 36},
		{Q2_K, 256, 84}, {Q3_K, 256, 110}, {Q4_K, 256, 144}, {Q5_K, 256, 176},
		{Q6_K, 256, 210}, {Q8_K, 256, 292},
	}
	for _, tt := range tests {
		t.Run(tt.t.String(), func(t *testing.T) {
			if got := tt.t.BlockSize(); got != tt.block {
				t.Errorf("BlockSize = %d, want %d", got, tt.block)
			}
			if got := tt.t.TypeSize(); got != tt.bytes {
				t.Errorf("TypeSize = %d, want %d", got, tt.bytes)
			}
			if !tt.t.Known() {
				t.Errorf("Known = false")
			}
		})
	}
}

func TestDTypeComputable(t *testing.T) {
	want := map[DType]bool{F32: true, F16: true, BF16: true, Q8_0: true, Q4_0: true, Q4_K: true, Q6_K: true}
	for _, d := range []DType{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, I8, I16, I32, I64, F64} {
		if got := d.Computable(); got != want[d] {
			t.Errorf("%s.Computable() = %v, want %v", d, got, want[d])
		}
	}
	// Gaps between the known ids, past the last, and far past it.
	for _, d := range []DType{4, 5, 16, 23, 29, 31, 99, 1 << 31, ^DType(0)} {
		if d.Known() || d.Computable() || d.BlockSize() != 0 || d.TypeSize() != 0 {
			t.Errorf("type %d should be unknown", uint32(d))
		}
		if got, want := d.String(), fmt.Sprintf("type(%d)", uint32(d)); got != want {
			t.Errorf("String of unknown = %q, want %q", got, want)
		}
		if _, err := d.RowBytes(32); err == nil {
			t.Errorf("RowBytes of unknown type %d succeeded", uint32(d))
		}
	}
}

func TestRowBytes(t *testing.T) {
	tests := []struct {
		t       DType
		n       uint64
		want    uint64
		wantErr string
	}{
		{F32, 7, 28, ""},
		{F16, 172, 344, ""},
		{Q4_0, 64, 36, ""},
		{Q8_0, 4096, 4096 / 32 * 34, ""},
		{Q4_K, 512, 288, ""},
		{Q6_K, 256, 210, ""},
		{Q4_0, 33, 0, "multiple of 32"},
		{Q4_K, 255, 0, "multiple of 256"},
		{DType(99), 1, 0, "unknown tensor type 99"},
		{F64, math.MaxUint64 / 4, 0, "overflow"},
	}
	for _, tt := range tests {
		got, err := tt.t.RowBytes(tt.n)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s.RowBytes(%d) error = %v, want %q", tt.t, tt.n, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s.RowBytes(%d) = %d, %v; want %d", tt.t, tt.n, got, err, tt.want)
		}
	}
}

func TestParseDType(t *testing.T) {
	for _, s := range []string{"q4_0", "Q4_0", "f16", "BF16", "q6_k", "Q8_0", "f32"} {
		d, err := ParseDType(s)
		if err != nil {
			t.Fatalf("ParseDType(%q): %v", s, err)
		}
		if !strings.EqualFold(d.String(), s) {
			t.Errorf("ParseDType(%q) = %s", s, d)
		}
	}
	if _, err := ParseDType("q3"); err == nil || !strings.Contains(err.Error(), "q4_0") {
		t.Errorf("ParseDType(q3) error = %v, want one listing the valid names", err)
	}
}

func TestParseWriteType(t *testing.T) {
	for _, s := range []string{"f32", "F16", "bf16", "q8_0", "q4_0"} {
		if _, err := ParseWriteType(s); err != nil {
			t.Errorf("ParseWriteType(%q): %v", s, err)
		}
	}
	for _, s := range []string{"q4_k", "q6_k", "q3", ""} {
		if _, err := ParseWriteType(s); err == nil || !strings.Contains(err.Error(), "q4_0") {
			t.Errorf("ParseWriteType(%q) error = %v, want one listing the writable types", s, err)
		}
	}
}
