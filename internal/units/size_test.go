package units

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		err  string
	}{
		{"4096", 4096, ""},
		{"512MiB", 512 << 20, ""},
		{"512 MiB", 512 << 20, ""},
		{"512m", 512 << 20, ""},
		{"1.5GB", 1500000000, ""},
		{"1.5GiB", 3 << 29, ""},
		{"2g", 2 << 30, ""},
		{"100kb", 100000, ""},
		{"7B", 7, ""},
		{"0", 0, ""},
		{"", 0, "want a number"},
		{"MiB", 0, "want a number"},
		{"1.2.3MB", 0, "want a number"},
		{"-5MB", 0, "want a number"},
		{"12 parsecs", 0, "unknown unit"},
		{"5PB", 0, "unknown unit"},
		{"1e30", 0, "unknown unit"},
		{"99999999999TB", 0, "too large"},
	} {
		got, err := ParseSize(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSize(%q) = %d, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseSize checks ParseSize never panics and that what it accepts
// round-trips through a plain byte count.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5GB", "0", "", "1e9", "9999999999999999999999TB", ".", "1.GB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		m, err := ParseSize(strconv.FormatUint(n, 10))
		if err != nil || m != n {
			t.Fatalf("%q -> %d -> %d, %v", s, n, m, err)
		}
	})
}
