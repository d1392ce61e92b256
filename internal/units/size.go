// Package units reads the quantities users type: byte sizes in flags
// and configuration (the CLI's --budget, the mobile facade's "budget").
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the size suffixes ParseSize accepts, lower-cased. KB, MB,
// GB, TB are decimal (as storage is sold and rated); KiB, MiB, GiB, TiB
// and the one-letter K, M, G, T are binary (as memory is counted).
var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
}

// ParseSize reads a byte count: a number (fractions allowed) and an
// optional unit, e.g. "512MiB", "1.5GB", "4096".
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.') })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with an optional unit, like 512MiB, 1.5GB or 4096", s)
	}
	mul, ok := byteUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KB, MB, GB, TB for powers of 1000 or KiB, MiB, GiB, TiB for powers of 1024)", s, t[i:])
	}
	b := v * mul
	if b >= math.MaxUint64/2 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(math.Round(b)), nil
}
