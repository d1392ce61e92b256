package units

import (
	"fmt"
	"strconv"
	"strings"
)

// ParsePercent reads a share of a whole in percent, above 0 and at most
// 100, with or without the % sign: "25%", "12.5". NaN, infinities and
// anything outside (0, 100] are refused.
func ParsePercent(s string) (float64, error) {
	t := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0 && v <= 100) {
		return 0, fmt.Errorf("share %q: want a percentage above 0 and at most 100, like 25%%", s)
	}
	return v, nil
}
