package main

import (
	"errors"
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	const (
		race    = "fuzz: elapsed: 3s, execs: 759 (0/sec)\n--- FAIL: FuzzRequests (3.43s)\n    context deadline exceeded\nFAIL\n"
		crasher = "--- FAIL: FuzzX (1.00s)\n    context deadline exceeded\n    Failing input written to testdata/fuzz/FuzzX/abc\n"
		panics  = "--- FAIL: FuzzX (0.01s)\n    panic: index out of range\nFAIL\n"
	)
	clean := func() error { return nil }
	broken := func() error { return errors.New("exit status 1") }
	for _, tc := range []struct {
		name   string
		out    string
		replay func() error
		pass   bool
	}{
		{"the coordinator's late stop", race, clean, true},
		{"the late stop, but the corpus fails", race, broken, false},
		{"a failing input written", crasher, clean, false},
		{"another failure", panics, clean, false},
		{"no output", "", clean, false},
	} {
		replayed := false
		err := verdict([]byte(tc.out), func() error { replayed = true; return tc.replay() })
		if (err == nil) != tc.pass {
			t.Errorf("%s: %v, want pass %v", tc.name, err, tc.pass)
		}
		if tc.pass && !replayed {
			t.Errorf("%s: passed without replaying the corpus", tc.name)
		}
	}
}

// TestFindTargetsListsTheModulesFuzzers runs on this module: it must find
// the known targets, by package, and none under testdata.
func TestFindTargetsListsTheModulesFuzzers(t *testing.T) {
	ts, err := findTargets("../..")
	if err != nil {
		t.Fatal(err)
	}
	found := map[target]bool{}
	for _, tg := range ts {
		found[tg] = true
	}
	for _, want := range []target{{"./../../weights", "FuzzParseGGUF"}, {"./../../runtime/server", "FuzzRequests"}, {"./../../internal/jsonerr", "FuzzFieldPath"}} {
		if !found[want] {
			t.Errorf("%v not found among %d targets", want, len(ts))
		}
	}
	if len(ts) < 19 {
		t.Errorf("%d targets, want at least the 19 the module has", len(ts))
	}
}

// TestFuzzArgsBoundMinimizing checks the flags each target runs with: its
// own name anchored, the time, and the bound on minimizing.
func TestFuzzArgsBoundMinimizing(t *testing.T) {
	got := strings.Join(fuzzArgs(target{"./weights", "FuzzParseGGUF"}, "20s", "5s"), " ")
	want := "test -run ^$ -fuzz ^FuzzParseGGUF$ -fuzztime 20s -fuzzminimizetime 5s ./weights"
	if got != want {
		t.Errorf("args %q, want %q", got, want)
	}
}
