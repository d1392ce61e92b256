package sched

import (
	"runtime"
	"time"
)

// cpuTime runs fn and returns the CPU time its thread spent on it: time
// the OS gave other threads meanwhile is not counted. The goroutine stays
// on one thread for both clock readings. Without a thread CPU clock
// (threadCPU) it is fn's wall time.
func cpuTime(fn func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c0, ok := threadCPU(); ok {
		fn()
		c1, _ := threadCPU()
		return max(c1-c0, 0)
	}
	t0 := time.Now()
	fn()
	return time.Since(t0)
}
