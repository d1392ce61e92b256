package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tandem-llm/tandem/internal/interrupt"
)

// checkOutput refuses, before any work, an output file the command could
// not write at its end, or should not: a directory, a read-only file, one
// of the command's inputs, a file in a missing directory, or one in a
// directory the user may not write in. name says where the path came
// from ("--out", "output").
func checkOutput(name, path string, inputs ...string) error {
	if fi, err := os.Stat(path); err == nil {
		switch {
		case fi.IsDir():
			return fmt.Errorf("%w: %s %s is a directory; give a file name", errUsage, name, path)
		case fi.Mode().Perm()&0o222 == 0:
			// Renaming over it would succeed (the folder is what
			// counts), even for root in a read-only folder.
			return fmt.Errorf("%w: %s %s exists and is read-only; remove it first, or choose another name", errUsage, name, path)
		}
		for _, in := range inputs {
			if ii, err := os.Stat(in); err == nil && os.SameFile(fi, ii) {
				return fmt.Errorf("%w: %s %s is the input %s; choose another name", errUsage, name, path, in)
			}
		}
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: %s %s: its directory %s does not exist", errUsage, name, path, dir)
	}
	return checkWritable(name, dir)
}

// checkWritable creates and removes a file in dir, the one test of
// whether the user may write there that permissions, read-only mounts
// and quotas all answer.
func checkWritable(name, dir string) error {
	f, err := os.CreateTemp(dir, ".tandem-check-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the probe's name means nothing to the user
		}
		return fmt.Errorf("%w: %s: cannot write in %s: %v", errUsage, name, dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// reportDir makes dir, a folder for a run's reports (--out, --plots),
// before the run. A folder it makes is the run's: tracked, so Ctrl-C
// removes it, and discard removes it after a run that failed. One that
// was there before (--plots' default ".") is never touched.
func reportDir(name, dir string) (discard func(), err error) {
	discard = func() {}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		if err := os.MkdirAll(dir, 0o755); err != nil { // a file there says so
			return discard, fmt.Errorf("%s: %w", name, err)
		}
		return discard, nil
	}
	_, untrack, err := interrupt.Create(func() (string, error) { return dir, os.MkdirAll(dir, 0o755) })
	if err != nil {
		return discard, fmt.Errorf("%s: %w", name, err)
	}
	return func() {
		untrack()
		os.RemoveAll(dir)
	}, nil
}

// keepDir makes dir, the folder a benchmark keeps its models in (--dir),
// and checks the user may write there, before any model is made: a
// missing folder used to fail after the first model's synthesis.
func keepDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: --dir %s: %v", errUsage, dir, err)
	}
	return checkWritable("--dir", dir)
}
