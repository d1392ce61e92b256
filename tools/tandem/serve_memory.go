package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"time"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// memoryCheckEvery is how often serve reads the machine's available
// memory for --trim-below.
var memoryCheckEvery = 2 * time.Second

// watchMemory gives back the KV memory the lanes keep beyond their
// running and parked requests (finished requests' rows kept for prefix
// reuse, buffers earlier peaks left) whenever the machine's available
// memory falls below floor, as Android's onTrimMemory does for the
// mobile binding: on a robot the serve process must not be what pushes
// the planner or the camera into the OOM killer. It checks every period
// until ctx ends and says on log what each trim released. Nothing
// running is touched; later requests prefill what the rows would have
// saved.
func watchMemory(ctx context.Context, sc *sched.Scheduler, floor uint64, period time.Duration, available func() (uint64, error), log io.Writer) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		avail, err := available()
		if err != nil || avail >= floor || !holdsSpare(sc.Stats()) {
			continue
		}
		n, err := sc.TrimMemory(ctx)
		if err != nil {
			return // shut down
		}
		debug.FreeOSMemory() // host KV buffers are Go memory: hand the pages back now
		fmt.Fprintf(log, "tandem serve: available memory %s is below --trim-below %s: released %s of kept KV memory\n",
			progress.Bytes(avail), progress.Bytes(floor), progress.Bytes(uint64(n)))
	}
}

// holdsSpare reports whether some lane holds KV memory beyond its
// sequences in use, which a trim would release.
func holdsSpare(st sched.Stats) bool {
	for _, l := range st.Lanes {
		if l.KVHeldBytes > l.KVBytes {
			return true
		}
	}
	return false
}
