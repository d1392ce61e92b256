package units

import "testing"

func TestParsePercent(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
	}{
		{"25%", 25}, {" 12.5 % ", 12.5}, {"100", 100}, {"0.01%", 0.01},
	} {
		if got, err := ParsePercent(tc.in); err != nil || got != tc.want {
			t.Errorf("ParsePercent(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "%", "0%", "-5%", "100.5%", "NaN%", "nan", "Inf%", "+Inf", "25%%", "1e400", "abc%"} {
		if got, err := ParsePercent(bad); err == nil {
			t.Errorf("ParsePercent(%q) = %v, want an error", bad, got)
		}
	}
}
