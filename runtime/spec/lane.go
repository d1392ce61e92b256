package spec

import "sync"

// Lane is the compute lane a draft/target pair shares: whoever holds it
// computes, on all of the pair's cores. Load the target with
// model.Options{Lane: lane}: its Forward then holds the lane while it
// computes and lets go while it waits for streamed weights, and the
// decoder runs draft steps in exactly those gaps. So draft and target
// never compete for a core, and the draft is free while the target is
// IO-bound. The target has priority: once it wants the lane back, no new
// draft step starts, so it waits at most for the draft step in flight.
type Lane struct {
	mu      sync.Mutex
	cond    *sync.Cond
	busy    bool
	waiting int           // target-side Lock calls waiting
	free    chan struct{} // a signal after every Unlock, for the draft to retry
}

// NewLane makes a free lane.
func NewLane() *Lane {
	l := &Lane{free: make(chan struct{}, 1)}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Lock takes the lane for the target (model.Forward calls it).
func (l *Lane) Lock() {
	l.mu.Lock()
	l.waiting++
	for l.busy {
		l.cond.Wait()
	}
	l.waiting--
	l.busy = true
	l.mu.Unlock()
}

// Unlock lets the lane go.
func (l *Lane) Unlock() {
	l.mu.Lock()
	l.busy = false
	l.cond.Broadcast()
	l.mu.Unlock()
	select {
	case l.free <- struct{}{}:
	default:
	}
}

// tryDraft takes the lane for a draft step if it is free and the target
// is not waiting for it.
func (l *Lane) tryDraft() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy || l.waiting > 0 {
		return false
	}
	l.busy = true
	return true
}
