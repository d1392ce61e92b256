package bench

import "testing"

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

func BenchmarkMemcpy(b *testing.B) {
	const size = 256 << 20
	src := make([]byte, size)
	dst := make([]byte, size)
	b.SetBytes(2 * size)
	for b.Loop() {
		copy(dst, src)
	}
}
