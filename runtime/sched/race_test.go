//go:build race

package sched

// raceEnabled shrinks the real-model tests under the race detector,
// which slows decoding about tenfold.
const raceEnabled = true
