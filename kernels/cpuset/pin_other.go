//go:build !linux

package cpuset

import (
	"errors"
	"runtime"
)

var errUnsupported = errors.New("cpuset: pinning threads to CPUs needs Linux or Android; this is " + runtime.GOOS)

// Pin restricts the calling thread to s (Linux and Android only).
func Pin(s Set) error { return errUnsupported }

// Current is the calling thread's CPUs (Linux and Android only).
func Current() (Set, error) { return nil, errUnsupported }

// Allowed is the CPUs this process may run on (Linux and Android only).
func Allowed() (Set, error) { return nil, errUnsupported }

// Check reports whether threads can be pinned to s (Linux and Android
// only).
func Check(s Set) error { return errUnsupported }
