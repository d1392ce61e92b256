package model

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/weights"
)

// BenchmarkDecodeStepPinned is BenchmarkDecodeStep's stories260K steps
// with the pool's threads and the caller pinned to the first CPUs, as a
// pinned lane runs them (sched.LaneSpec.CPUs): pinned workers spin
// without yielding, and no thread migrates.
func BenchmarkDecodeStepPinned(b *testing.B) {
	allowed, err := cpuset.Allowed()
	if err != nil {
		b.Fatal(err)
	}
	for _, threads := range []int{1, 2} {
		if threads > len(allowed) {
			break
		}
		cpus := allowed[:threads]
		m := loadConvertedWith(b, "stories260K.bin", weights.F32, Options{Threads: threads, CPUs: cpus})
		for _, seqs := range []int{1, 8} {
			b.Run(fmt.Sprintf("threads=%d/seqs=%d", threads, seqs), func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				if err := cpuset.Pin(cpus); err != nil {
					b.Fatal(err)
				}
				defer cpuset.Pin(allowed) // the thread goes back to run anything
				benchDecodeStep(b, m, seqs)
			})
		}
	}
}
