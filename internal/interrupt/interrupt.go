// Package interrupt removes what a command interrupted by Ctrl-C leaves
// half made: temporary model files, benchmark directories. Commands that
// stop gracefully on a signal themselves (generate, train, serve) do not
// use it; the others call Handle for their run and Track what they make.
package interrupt

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var (
	mu      sync.Mutex
	tracked = map[string]int{} // path → how many Track calls hold it
)

// Track marks path (a file or a directory) for removal if the process is
// interrupted while a Handle is active; untrack when it is complete or
// removed. Tracking costs nothing without a Handle. A path made just
// before is better made by Create: an interrupt between the two would
// leave it.
func Track(path string) (untrack func()) {
	mu.Lock()
	defer mu.Unlock()
	return trackLocked(path)
}

// Create calls create, which makes a file or directory (os.CreateTemp,
// os.MkdirTemp) and returns its path, and tracks that path in the same
// step: an interrupt that arrives meanwhile removes it once it exists.
// With a Track after the create, a Ctrl-C in between left a temporary
// model file behind (a CLI test that interrupted inflate as soon as the
// file appeared caught it).
func Create(create func() (string, error)) (path string, untrack func(), err error) {
	mu.Lock()
	defer mu.Unlock()
	if path, err = create(); err != nil {
		return "", func() {}, err
	}
	return path, trackLocked(path), nil
}

// CreateTemp is os.CreateTemp through Create.
func CreateTemp(dir, pattern string) (f *os.File, untrack func(), err error) {
	_, untrack, err = Create(func() (string, error) {
		var err error
		if f, err = os.CreateTemp(dir, pattern); err != nil {
			return "", err
		}
		return f.Name(), nil
	})
	return f, untrack, err
}

// trackLocked is Track with mu held.
func trackLocked(path string) (untrack func()) {
	tracked[path]++
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			if tracked[path]--; tracked[path] <= 0 {
				delete(tracked, path)
			}
			mu.Unlock()
		})
	}
}

// Handle makes SIGINT and SIGTERM remove the tracked paths, say so on
// stderr after name (the command, like "tandem convert") and exit with
// status 130, until stop is called.
func Handle(stderr io.Writer, name string) (stop func()) {
	sig := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sig:
			// mu stays held to the exit: a Create after the removal
			// would make a file nothing removes.
			mu.Lock()
			n := removeTrackedLocked()
			fmt.Fprintf(stderr, "\n%s: interrupted (%v): removed %d unfinished file(s)\n", name, s, n)
			os.Exit(130)
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(sig)
			close(done)
		})
	}
}

// removeTrackedLocked deletes every tracked path and returns how many it
// did; mu is held.
func removeTrackedLocked() int {
	n := 0
	for path := range tracked {
		if os.RemoveAll(path) == nil {
			n++
		}
	}
	return n
}
