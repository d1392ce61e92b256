// Command fuzzall runs every fuzz target in the module for -fuzztime each
// and stops at the first failure (make fuzz).
//
// Go 1.26's fuzz coordinator can fail a target with a bare "context
// deadline exceeded" when it stops at -fuzztime (golang/go#75804, fixed
// in Go 1.27). Such a failure, with no failing input written and a corpus
// that then replays clean, is reported and the sweep goes on.
//
// Each new input the fuzzer keeps is minimized for at most -minimizetime
// (go test's default is a minute, uncounted in the executions it reports):
// FuzzParseGGUF, whose seeds are 4-20 KB of a real model, spent whole
// 40-60 s runs minimizing one input, at 47-85 executions, where it
// otherwise makes 15k a second.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	fuzztime := flag.String("fuzztime", "20s", "how long each target fuzzes (a duration, or Nx for N runs)")
	minimize := flag.String("minimizetime", "5s", "how long the fuzzer may minimize each input it keeps or fails on")
	goCmd := flag.String("go", "go", "the go command")
	flag.Parse()
	targets, err := findTargets(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuzzall:", err)
		os.Exit(1)
	}
	for _, t := range targets {
		fmt.Printf("== %s %s\n", t.pkg, t.name)
		if err := fuzz(*goCmd, t, fuzzArgs(t, *fuzztime, *minimize)); err != nil {
			fmt.Fprintf(os.Stderr, "fuzzall: %s %s: %v\n", t.pkg, t.name, err)
			os.Exit(1)
		}
	}
}

// target is one fuzz function and its package directory ("./weights").
type target struct{ pkg, name string }

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w*)\(`)

// findTargets lists the fuzz functions of the test files under root, by
// package, skipping testdata and hidden directories.
func findTargets(root string) ([]target, error) {
	var ts []target
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(path))
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			ts = append(ts, target{pkg, string(m[1])})
		}
		return nil
	})
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].pkg != ts[j].pkg {
			return ts[i].pkg < ts[j].pkg
		}
		return ts[i].name < ts[j].name
	})
	return ts, err
}

// fuzzArgs is the go command's arguments that fuzz t.
func fuzzArgs(t target, fuzztime, minimize string) []string {
	return []string{"test", "-run", "^$", "-fuzz", "^" + t.name + "$", "-fuzztime", fuzztime, "-fuzzminimizetime", minimize, t.pkg}
}

// fuzz runs one target with args (fuzzArgs), printing the last lines of
// its output when it passes and all of it when it fails.
func fuzz(goCmd string, t target, args []string) error {
	var out bytes.Buffer
	cmd := exec.Command(goCmd, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil {
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		fmt.Println(strings.Join(lines[max(0, len(lines)-2):], "\n"))
		return nil
	}
	os.Stdout.Write(out.Bytes())
	replay := func() error {
		return exec.Command(goCmd, "test", "-run", "^"+t.name+"$", t.pkg).Run()
	}
	if err := verdict(out.Bytes(), replay); err != nil {
		return err
	}
	fmt.Println("   no failing input and the corpus replays clean: Go's coordinator stopped late (golang/go#75804)")
	return nil
}

// lateStop is how the coordinator's late stop fails a target: the error
// alone on its line.
var lateStop = regexp.MustCompile(`(?m)^\s+context deadline exceeded$`)

// verdict judges a failed fuzz run from its output: nil when it is only
// the coordinator's late stop (a bare "context deadline exceeded", no
// failing input written) and the target's corpus replays clean.
func verdict(out []byte, replay func() error) error {
	if bytes.Contains(out, []byte("Failing input written")) {
		return errors.New("the fuzzer found a failing input")
	}
	if !lateStop.Match(out) {
		return errors.New("the target failed")
	}
	if err := replay(); err != nil {
		return fmt.Errorf("its corpus does not replay clean: %w", err)
	}
	return nil
}
