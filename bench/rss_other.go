//go:build !linux

package bench

// Peak RSS per configuration needs Linux's /proc/self/clear_refs; other
// platforms report 0.
func resetPeakRSS()      {}
func peakRSS() uint64    { return 0 }
func currentRSS() uint64 { return 0 }
