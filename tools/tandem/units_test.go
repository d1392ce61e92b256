package main

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/units"
)

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  string
	}{
		{"400MB/s", 400e6, ""},
		{"1.5GB/s", 1.5e9, ""},
		{"100MiB/s", 100 << 20, ""},
		{"3 GB/S", 3e9, ""},
		{"off", 0, ""},
		{"0", 0, ""},
		{"400MB", 0, "size per second"},
		{"0MB/s", 0, "zero"},
		{"fastMB/s", 0, "want a number"},
	} {
		got, err := parseBandwidth(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseBandwidth(%q) = %g, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseBandwidth(%q) = %g, %v; want %g", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseBandwidth checks parseBandwidth never panics and that a rate
// it accepts is the size it is made of (units.ParseSize has its own fuzz
// target).
func FuzzParseBandwidth(f *testing.F) {
	for _, s := range []string{"400MB/s", "1.5GB/s", "off", "0", "", "1e9/s", "9999999999999999999999TB/s", "./s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		bw, err := parseBandwidth(s)
		if err != nil || bw == 0 {
			return
		}
		n, err := units.ParseSize(strings.TrimSpace(s)[:len(strings.TrimSpace(s))-2])
		if err != nil || float64(n) != bw {
			t.Fatalf("%q -> %g, but its size reads %d, %v", s, bw, n, err)
		}
	})
}
