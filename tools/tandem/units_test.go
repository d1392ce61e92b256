package main

import (
	"errors"
	"math"
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
		{"1B/s", 0, "below 1MB/s"},
		{"999999/s", 0, "below 1MB/s"},
		{"1MB/s", 1e6, ""},
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

// FuzzListFlags: the comma lists of the benchmarks (--loads, --budgets,
// --storage, --policies) never panic, refuse with a usage error, and what
// they accept lies in the flag's range: NaN once passed a check written
// x < lo || x > hi.
func FuzzListFlags(f *testing.F) {
	for _, s := range []string{"0.3,0.6,1.6", "NaN", "25%,50", "disk,400MB/s", "tandem,fifo,tandem-admit", "1e400", "-0", " , ", "Inf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if xs, err := parseFloats("--loads", s, 0.01, 100); err != nil {
			if !errors.Is(err, errUsage) {
				t.Fatalf("parseFloats(%q): %v is not a usage error", s, err)
			}
		} else {
			for _, x := range xs {
				if !(x >= 0.01 && x <= 100) {
					t.Fatalf("parseFloats(%q) accepted %v", s, x)
				}
			}
		}
		if ps, err := parsePercents(s); err == nil {
			for _, p := range ps {
				if !(p > 0 && p <= 100) {
					t.Fatalf("parsePercents(%q) accepted %v", s, p)
				}
			}
		}
		if bws, err := parseStorage(s); err == nil {
			for _, bw := range bws {
				if !(bw >= 0) || math.IsInf(bw, 0) {
					t.Fatalf("parseStorage(%q) accepted %v", s, bw)
				}
			}
		}
		if ps, err := parsePolicies(s); err == nil && len(ps) != len(strings.Split(s, ",")) {
			t.Fatalf("parsePolicies(%q) = %d policies for %d names", s, len(ps), len(strings.Split(s, ",")))
		}
	})
}
