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
	"path/filepath"
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

// Output is a file written beside its destination and renamed over it by
// Commit: a failed write leaves neither a half file under the path nor a
// temporary one, and while a Handle is active Ctrl-C removes it. convert,
// the GGUF writer, corpus and bench sched's outcomes all write this way.
type Output struct {
	*os.File
	path    string
	untrack func()
	done    bool
}

// CreateOutput starts writing path: a tracked temporary file in its folder,
// named after it (path's base + ".tmp" and a random suffix).
func CreateOutput(path string) (*Output, error) {
	f, untrack, err := CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, err
	}
	return &Output{File: f, path: path, untrack: untrack}, nil
}

// Commit gives the file os.Create's mode (CreateTemp makes it 0600),
// closes it and renames it to its path. On an error the temporary file is
// removed and the path left as it was.
func (o *Output) Commit() error {
	if o.done {
		return fmt.Errorf("%s: already committed or discarded", o.path)
	}
	err := o.Chmod(0o644)
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(o.Name(), o.path)
	}
	if err != nil {
		os.Remove(o.Name())
	}
	o.done = true
	o.untrack() // after the removal: tracked until it is gone
	return err
}

// Discard closes and removes the temporary file; after Commit it does
// nothing, so a deferred Discard guards every early return.
func (o *Output) Discard() {
	if o.done {
		return
	}
	o.Close()
	os.Remove(o.Name())
	o.done = true
	o.untrack()
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
