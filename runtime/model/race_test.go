//go:build race

package model

// raceEnabled shortens the pure-Go parity runs under the race detector,
// and spares pooled buffers the allocation checks (the detector makes
// sync.Pool drop items at random).
const raceEnabled = true
