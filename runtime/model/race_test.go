//go:build race

package model

// raceEnabled shortens the pure-Go parity runs under the race detector.
const raceEnabled = true
