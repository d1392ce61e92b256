package main

import (
	"strconv"
	"strings"
	"testing"
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

// FuzzParseSize checks parseSize never panics and that what it accepts
// round-trips through a plain byte count.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5GB", "0", "", "1e9", "9999999999999999999999TB", ".", "1.GB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		m, err := parseSize(strconv.FormatUint(n, 10))
		if err != nil || m != n {
			t.Fatalf("%q -> %d -> %d, %v", s, n, m, err)
		}
		parseBandwidth(s + "/s")
	})
}
