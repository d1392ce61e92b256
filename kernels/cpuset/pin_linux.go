package cpuset

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Pin restricts the calling thread to s. The caller locks its goroutine
// to the thread first (runtime.LockOSThread): affinity belongs to the
// thread, and an unlocked goroutine moves between threads.
func Pin(s Set) error {
	if len(s) > 0 && s[len(s)-1] > MaxPinned {
		return fmt.Errorf("cpuset: CPU %d is past the last a thread can be pinned to here (%d)", s[len(s)-1], MaxPinned)
	}
	var mask unix.CPUSet
	for _, c := range s {
		mask.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &mask); err != nil {
		return fmt.Errorf("cpuset: pinning a thread to CPUs %s: %w", s, err)
	}
	return nil
}

// Current is the calling thread's CPUs.
func Current() (Set, error) {
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		return nil, fmt.Errorf("cpuset: reading CPU affinity: %w", err)
	}
	var s Set
	for c := 0; c <= MaxPinned; c++ {
		if mask.IsSet(c) {
			s = append(s, c)
		}
	}
	return s, nil
}

// Allowed is the CPUs this process may run on (taskset's or a
// container's limits): the calling thread's, which is not pinned unless
// its goroutine pinned it. (The process's first thread may be pinned: a
// goroutine locked to it that exits leaves it wedged as it was.)
func Allowed() (Set, error) { return Current() }

// Check reports whether threads can be pinned to s: it is not empty and
// within the CPUs this process may use, the only CPUs the kernel pins to.
func Check(s Set) error {
	if len(s) == 0 {
		return fmt.Errorf("cpuset: no CPUs to pin to")
	}
	allowed, err := Allowed()
	if err != nil {
		return err
	}
	if !allowed.Contains(s) {
		return fmt.Errorf("cpuset: cannot pin to CPUs %s: this process may use only %s", s, allowed)
	}
	return nil
}
