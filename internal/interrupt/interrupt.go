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
// removed. Tracking costs nothing without a Handle.
func Track(path string) (untrack func()) {
	mu.Lock()
	tracked[path]++
	mu.Unlock()
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
// stderr and exit with status 130, until stop is called.
func Handle(stderr io.Writer) (stop func()) {
	sig := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sig:
			n := removeTracked()
			fmt.Fprintf(stderr, "\ninterrupted (%v): removed %d unfinished file(s)\n", s, n)
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

// removeTracked deletes every tracked path and returns how many it did.
func removeTracked() int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for path := range tracked {
		if os.RemoveAll(path) == nil {
			n++
		}
	}
	return n
}
