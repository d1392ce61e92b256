package main

import (
	"fmt"
	"strings"

	"github.com/tandem-llm/tandem/internal/units"
)

// minBandwidth is the slowest storage --io-bandwidth emulates: a rate
// in bytes a second below it is a typo (1B/s for 1GB/s), and runs that
// never end.
const minBandwidth = 1e6

// parseBandwidth reads a rate in bytes per second: a size followed by
// "/s", e.g. "400MB/s", "1.5GB/s"; "0" or "off" means unlimited (0).
func parseBandwidth(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if t == "0" || strings.EqualFold(t, "off") {
		return 0, nil
	}
	lower := strings.ToLower(t)
	if !strings.HasSuffix(lower, "/s") {
		return 0, fmt.Errorf("bandwidth %q: want a size per second, like 400MB/s or 1.5GB/s (or off)", s)
	}
	n, err := units.ParseSize(t[:len(t)-2])
	if err != nil {
		return 0, fmt.Errorf("bandwidth %q: %w", s, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("bandwidth %q is zero; use off for unlimited", s)
	}
	if n < minBandwidth {
		return 0, fmt.Errorf("bandwidth %q is below 1MB/s, slower than any storage a device boots from (an old SD card reads 10MB/s): a small model would take hours to read; want 1MB/s or more", s)
	}
	return float64(n), nil
}
