//go:build linux

package bench

import (
	"os"
	"strconv"
	"strings"
)

// resetPeakRSS restarts the kernel's peak-RSS count (VmHWM) from the
// current RSS, so each benchmark configuration reports its own peak.
func resetPeakRSS() { os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is VmHWM: the most resident memory since the last reset.
func peakRSS() uint64 { return statusBytes("VmHWM:") }

// currentRSS is VmRSS.
func currentRSS() uint64 { return statusBytes("VmRSS:") }

func statusBytes(field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
