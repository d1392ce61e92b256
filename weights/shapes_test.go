package weights

import (
	"strings"
	"testing"
)

func TestParseDims(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Shape
		wantErr string
	}{
		{in: "64,172,4,8,4,512", want: Shape{Name: "custom", Dim: 64, Hidden: 172, Layers: 4, Heads: 8, KVHeads: 4, Vocab: 512, Context: 2048}},
		{in: " 288, 768,6,6,6,32000,256", want: Shape{Name: "custom", Dim: 288, Hidden: 768, Layers: 6, Heads: 6, KVHeads: 6, Vocab: 32000, Context: 256}},
		{in: "64,172,4,8", wantErr: "want dim,hidden"},
		{in: "64,172,4,8,4,512,256,1", wantErr: "want dim,hidden"},
		{in: "64,x,4,8,4,512", wantErr: `hidden "x"`},
		{in: "64,172,0,8,4,512", wantErr: `layers "0"`},
		{in: "64,172,4,8,3,512", wantErr: "kv heads 3"},
		{in: "60,172,4,8,4,512", wantErr: "even head size"},
		{in: "", wantErr: "want dim,hidden"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDims(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestShapesTable(t *testing.T) {
	for _, tc := range []struct {
		name                                     string
		dim, hidden, layers, heads, kvHeads, kvd int
	}{
		{"stories15m", 288, 768, 6, 6, 6, 288},
		{"stories110m", 768, 2048, 12, 12, 12, 768},
		{"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 256},
		{"llama2-7b", 4096, 11008, 32, 32, 32, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := LookupShape(strings.ToUpper(tc.name))
			if err != nil {
				t.Fatal(err)
			}
			if s.Dim != tc.dim || s.Hidden != tc.hidden || s.Layers != tc.layers || s.Heads != tc.heads ||
				s.KVHeads != tc.kvHeads || s.Vocab != 32000 || s.KVDim() != tc.kvd {
				t.Errorf("%+v (kv dim %d)", s, s.KVDim())
			}
			if err := s.Validate(); err != nil {
				t.Error(err)
			}
			ts := s.Tensors(Q4_0)
			if len(ts) != 3+9*s.Layers {
				t.Errorf("%d tensors", len(ts))
			}
			md := s.Metadata("x", Q4_0)
			if n, _ := md.Uint("llama.attention.head_count_kv"); n != uint64(tc.kvHeads) {
				t.Errorf("head_count_kv %d", n)
			}
			if n, _ := md.Uint("llama.rope.dimension_count"); n != uint64(tc.dim/tc.heads) {
				t.Errorf("rope.dimension_count %d", n)
			}
		})
	}
}

// FuzzParseDims: any string either fails or gives a shape that validates
// and whose tensor list can be sized.
func FuzzParseDims(f *testing.F) {
	for _, s := range []string{"64,172,4,8,4,512", "1,1,1,1,1,1", "64,172,4,8,4,512,99", ",,,,,", "16777216,1,1,1,1,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseDims(in)
		if err != nil {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("ParseDims(%q) returned an invalid shape: %v", in, err)
		}
		if s.Layers > 64 {
			return // keep the tensor list small
		}
		for _, ti := range s.Tensors(Q8_0) {
			if _, err := ti.Bytes(); err != nil {
				t.Fatalf("%q: %s: %v", in, ti.Name, err)
			}
		}
	})
}

func TestParseDimsNamesTheContext(t *testing.T) {
	// The seventh field is the context; a value past the bound says so.
	if _, err := ParseDims("128,384,6,8,4,512,1000000000"); err == nil || !strings.Contains(err.Error(), `context "1000000000"`) {
		t.Errorf("err %v, want the context named", err)
	}
}
