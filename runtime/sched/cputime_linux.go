package sched

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time, or false where the clock
// cannot be read.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
