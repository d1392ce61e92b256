package sched

import (
	"runtime"
	"testing"
	"time"
)

// TestThreadCPUCountsWorkNotWaiting checks the clock Submit charges
// scoring by: it advances while the thread computes and stands still
// while it sleeps, so a thread the OS sets aside is not charged.
func TestThreadCPUCountsWorkNotWaiting(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0, ok := threadCPU()
	if !ok {
		if runtime.GOOS == "linux" || runtime.GOOS == "android" {
			t.Fatal("no thread CPU clock on Linux")
		}
		t.Skipf("no thread CPU clock on %s: scoring is charged its wall time", runtime.GOOS)
	}
	time.Sleep(50 * time.Millisecond)
	c1, _ := threadCPU()
	if slept := c1 - c0; slept < 0 || slept > 10*time.Millisecond {
		t.Errorf("sleeping 50 ms took %v of the thread's CPU time", slept)
	}
	// Spin until the clock has moved 5 ms; a clock that stands still
	// runs into the deadline.
	x, deadline := 1.0, time.Now().Add(10*time.Second)
	c2 := c1
	for c2-c1 < 5*time.Millisecond && time.Now().Before(deadline) {
		for range 10000 {
			x = x*1.0000001 + 1e-9
		}
		c2, _ = threadCPU()
	}
	if c2-c1 < 5*time.Millisecond {
		t.Errorf("10 s of computing moved the thread's CPU clock %v (x=%v)", c2-c1, x)
	}
}
