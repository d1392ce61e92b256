//go:build race

package model

// raceEnabled shortens the streaming tests under the race detector.
const raceEnabled = true
