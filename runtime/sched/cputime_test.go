package sched

import (
	"runtime"
	"testing"
	"time"
)

// TestCPUTimeCountsWorkNotWaiting checks the charge Submit puts on
// scoring: a function that sleeps costs next to nothing, one that
// computes costs what it computed, so a thread the OS sets aside is not
// charged.
func TestCPUTimeCountsWorkNotWaiting(t *testing.T) {
	if _, ok := threadCPU(); !ok {
		if runtime.GOOS == "linux" || runtime.GOOS == "android" {
			t.Fatal("no thread CPU clock on Linux")
		}
		t.Skipf("no thread CPU clock on %s: scoring is charged its wall time", runtime.GOOS)
	}
	if slept := cpuTime(func() { time.Sleep(50 * time.Millisecond) }); slept > 10*time.Millisecond {
		t.Errorf("sleeping 50 ms was charged %v", slept)
	}
	// Compute until the thread's clock has moved 5 ms (a clock that
	// stands still runs into the deadline).
	x := 1.0
	spun := cpuTime(func() {
		c0, _ := threadCPU()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			for range 10000 {
				x = x*1.0000001 + 1e-9
			}
			if c, _ := threadCPU(); c-c0 >= 5*time.Millisecond {
				return
			}
		}
	})
	if spun < 5*time.Millisecond {
		t.Errorf("computing for 5 ms of CPU was charged %v (x=%v)", spun, x)
	}
}
