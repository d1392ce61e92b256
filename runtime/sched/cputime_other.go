//go:build !linux

package sched

import "time"

// threadCPU has no per-thread clock to read here: scoring is charged its
// wall time.
func threadCPU() (time.Duration, bool) { return 0, false }
