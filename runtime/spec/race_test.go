//go:build race

package spec

// raceEnabled shrinks the statistical tests under the race detector,
// which slows them about tenfold.
const raceEnabled = true
