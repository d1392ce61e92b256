package bench

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/weights"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		in := append([]float64(nil), tt.in...)
		if got := Median(tt.in); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.in[i] {
				t.Errorf("Median modified its input: %v", tt.in)
			}
		}
	}
}

func TestMemoryBandwidthReportsWhatItMeasured(t *testing.T) {
	bw := MemoryBandwidth(2, 1<<20, 3)
	if bw.Threads != 2 || bw.BufferBytes != 1<<20 {
		t.Errorf("got threads %d buffer %d", bw.Threads, bw.BufferBytes)
	}
	if bw.BytesPerSec <= 0 {
		t.Errorf("BytesPerSec = %v", bw.BytesPerSec)
	}
}

func BenchmarkMemoryBandwidth(b *testing.B) {
	for b.Loop() {
		bw := MemoryBandwidth(1, 256<<20, 1)
		b.ReportMetric(bw.BytesPerSec/1e9, "GB/s")
	}
}

func TestKernelPeak(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, wt := range []weights.DType{weights.Q4_0, weights.Q8_0, weights.F16} {
		k, err := KernelPeak(pool, wt, 16, 64, 2)
		if err != nil {
			t.Fatalf("%s: %v", wt, err)
		}
		if k.Type != wt || k.Threads != 2 || !(k.BytesPerSec > 0) {
			t.Errorf("%s: got %+v", wt, k)
		}
	}
	if _, err := KernelPeak(pool, weights.Q4_0, 16, 33, 1); err == nil {
		t.Error("Q4_0 with 33 columns: want an error")
	}
}

func TestDecodeTable(t *testing.T) {
	r := DecodeResult{Type: "Q4_0", Threads: 2, WeightBytesPerToken: 1 << 20,
		Decode: []float64{9, 10, 14}, DecodeTokPerS: 10, Prefill: []float64{100}, PrefillTokPerS: 100}
	got := DecodeTable([]DecodeResult{r}, map[int]float64{2: 20 << 20}, map[PeakKey]float64{{"Q4_0", 2}: 40 << 20})
	for _, want := range []string{
		"| Q4_0 | 2 | 1.0 | 10.00 (9.00-14.00) | 20.00 | 50% | 40.00 | 25% | 100.0 | 10.0x |", // medians: a mean of 11 would not be

		"| type | threads |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	// No bounds measured: dashes, not division by zero.
	got = DecodeTable([]DecodeResult{r}, nil, nil)
	if !strings.Contains(got, "| - | - | - | - |") {
		t.Errorf("missing bounds not dashed:\n%s", got)
	}
}
