package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/weights"
)

func TestParseLanes(t *testing.T) {
	cpu := func(n int) sched.LaneSpec { return sched.LaneSpec{Threads: n} }
	gpu := func(d string) sched.LaneSpec { return sched.LaneSpec{Device: d} }
	pinned := func(n int, cpus ...int) sched.LaneSpec { return sched.LaneSpec{Threads: n, CPUs: cpus} }
	// A phone: little cores 0-3, big 4-7.
	phone := cpuset.Topology{{CPUs: cpuset.Set{4, 5, 6, 7}, Capacity: 1024}, {CPUs: cpuset.Set{0, 1, 2, 3}, Capacity: 325}}.Named
	for _, tc := range []struct {
		in   string
		want []sched.LaneSpec
		ok   bool
	}{
		{"3,1", []sched.LaneSpec{cpu(3), cpu(1)}, true},
		{"cpu:2", []sched.LaneSpec{cpu(2)}, true},
		{"cuda", []sched.LaneSpec{gpu("cuda")}, true},
		{"cuda,4", []sched.LaneSpec{gpu("cuda"), cpu(4)}, true},
		{"4, cuda:1", []sched.LaneSpec{cpu(4), gpu("cuda:1")}, true},
		{"cuda:0,cuda:1", []sched.LaneSpec{gpu("cuda:0"), gpu("cuda:1")}, true},
		{"0", nil, false}, {"a", nil, false}, {"3,", nil, false},
		{"gpu", nil, false}, {"gpu:0", nil, false},
		{"cuda:", nil, false}, {"cuda:-1", nil, false}, {"cuda:x", nil, false}, {"cuda0", nil, false},
		{"4@big,2@little", []sched.LaneSpec{pinned(4, 4, 5, 6, 7), pinned(2, 0, 1, 2, 3)}, true},
		{"big,little", []sched.LaneSpec{pinned(4, 4, 5, 6, 7), pinned(4, 0, 1, 2, 3)}, true},
		{"cpu:1@6, 2@0-1", []sched.LaneSpec{pinned(1, 6), pinned(2, 0, 1)}, true},
		{"0@2-3,cuda", []sched.LaneSpec{pinned(2, 2, 3), gpu("cuda")}, true},
		{"3@0-1", nil, false}, {"5@big", nil, false}, {"4@", nil, false}, {"4@mid", nil, false},
		{"@big", nil, false}, {"cuda@big", nil, false}, {"cuda:0@1", nil, false}, {"1@3-1", nil, false},
		{"0@0-270", nil, false}, {"257", nil, false}, {"257@0-300", nil, false},
	} {
		got, err := parseLanesWith(tc.in, phone)
		if (err == nil) != tc.ok || (tc.ok && fmt.Sprint(got) != fmt.Sprint(tc.want)) {
			t.Errorf("parseLanes(%q) = %v, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, errUsage) {
			t.Errorf("parseLanes(%q): %v is not a usage error", tc.in, err)
		}
	}
	if got, err := parseLanes(""); err != nil || len(got) != 1 || got[0].GPU() || got[0].Threads < 1 {
		t.Errorf("default lanes %v, %v", got, err)
	}
	if _, err := parseLanes("gpu"); err == nil || !strings.Contains(err.Error(), "cuda") {
		t.Errorf("--lanes gpu: %v, want a hint to write cuda", err)
	}
	if _, err := parseLanesWith("3@0-1", phone); err == nil || !strings.Contains(err.Error(), "at most 2") {
		t.Errorf("--lanes 3@0-1: %v, want at most 2 threads", err)
	}
	if _, err := parseLanesWith("0@0-270", phone); err == nil || !strings.Contains(err.Error(), "271 threads, one per CPU of 0-270; a lane takes at most 256, so give a thread count") {
		t.Errorf("--lanes 0@0-270: %v, want at most 256 threads", err)
	}
	// On this machine: a CPU list resolves as written.
	if got, err := parseLanes("1@0"); err != nil || fmt.Sprint(got) != fmt.Sprint([]sched.LaneSpec{pinned(1, 0)}) {
		t.Errorf("--lanes 1@0 = %v, %v", got, err)
	}
}

// FuzzParseLanes: --lanes never panics, refuses with a usage error, and
// what it accepts is a set of lanes that pass their own check and read
// back the same when written as --lanes writes them.
func FuzzParseLanes(f *testing.F) {
	phone := cpuset.Topology{{CPUs: cpuset.Set{4, 5, 6, 7}, Capacity: 1024}, {CPUs: cpuset.Set{0, 1, 2, 3}, Capacity: 325}}.Named
	for _, s := range []string{"3,1", "cpu:2", "cuda,4", "4, cuda:1", "4@big,2@little", "big,little",
		"cpu:1@6, 2@0-1", "0@2-3,cuda", "3@0-1", "cuda:0@1", "1@3-1", "2@0,2,4-5", "cuda:99999999999999999999", " , "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseLanesWith(s, phone)
		if err != nil {
			if !errors.Is(err, errUsage) {
				t.Fatalf("parseLanes(%q): %v is not a usage error", s, err)
			}
			return
		}
		parts := make([]string, len(got))
		for i, l := range got {
			if err := l.Check(); err != nil {
				t.Fatalf("parseLanes(%q) accepted lane %d (%v), which its check refuses: %v", s, i, l, err)
			}
			if !l.GPU() && (l.Threads < 1 || l.Threads > 256) {
				t.Fatalf("parseLanes(%q): lane %d has %d threads", s, i, l.Threads)
			}
			parts[i] = l.String()
		}
		again, err := parseLanesWith(strings.Join(parts, ","), phone)
		if err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
			t.Fatalf("parseLanes(%q) = %v, written %q, read back as %v, %v", s, got, strings.Join(parts, ","), again, err)
		}
	})
}

// TestPinHint: serve suggests pinning two floating CPU lanes on a
// phone's big and little cores, and nothing elsewhere.
func TestPinHint(t *testing.T) {
	phone := cpuset.Topology{{CPUs: cpuset.Set{4, 5, 6, 7}, Capacity: 870}, {CPUs: cpuset.Set{0, 1, 2, 3}, Capacity: 325}}
	alike := cpuset.Topology{{CPUs: cpuset.Set{0, 1, 2, 3}, Capacity: 1024}}
	floating := []sched.LaneSpec{{Threads: 4}, {Threads: 2}}
	if got := pinHint(floating, phone); !strings.Contains(got, "--lanes 4@big,4@little") || !strings.Contains(got, "big cores (4-7) and little ones (0-3)") {
		t.Errorf("two floating lanes on a phone: %q", got)
	}
	for _, tc := range []struct {
		name  string
		specs []sched.LaneSpec
		topo  cpuset.Topology
	}{
		{"alike cores", floating, alike},
		{"one lane", floating[:1], phone},
		{"pinned", []sched.LaneSpec{{Threads: 4, CPUs: cpuset.Set{4, 5, 6, 7}}, {Threads: 2}}, phone},
		{"GPU and CPU", []sched.LaneSpec{{Device: "cuda"}, {Threads: 4}}, phone},
	} {
		if got := pinHint(tc.specs, tc.topo); got != "" {
			t.Errorf("%s: %q, want no hint", tc.name, got)
		}
	}
}

// TestTurnsHint: serve warns when the CPU lanes run more threads than
// the process has CPUs, and only then.
func TestTurnsHint(t *testing.T) {
	vm := cpuset.Set{0, 1}
	if got := turnsHint([]sched.LaneSpec{{Threads: 3}, {Threads: 3}}, vm); !strings.Contains(got, "6 threads on the 2 CPUs") || !strings.Contains(got, "at most 2 threads together") {
		t.Errorf("--lanes 3,3 on 2 CPUs: %q", got)
	}
	if got := turnsHint([]sched.LaneSpec{{Threads: 2}, {Threads: 1, CPUs: cpuset.Set{1}}}, vm); got == "" {
		t.Error("3 threads, one pinned, on 2 CPUs: no hint")
	}
	for name, specs := range map[string][]sched.LaneSpec{
		"one a CPU":        {{Threads: 1}, {Threads: 1}},
		"a GPU lane":       {{Device: "cuda"}, {Threads: 2}},
		"fewer than CPUs":  {{Threads: 1}},
		"pinned, one each": {{Threads: 1, CPUs: cpuset.Set{0}}, {Threads: 1, CPUs: cpuset.Set{1}}},
	} {
		if got := turnsHint(specs, vm); got != "" {
			t.Errorf("%s: %q, want no hint", name, got)
		}
	}
	if got := turnsHint([]sched.LaneSpec{{Threads: 8}}, nil); got != "" {
		t.Errorf("CPUs unknown: %q, want no hint", got)
	}
}

// TestCrowdHint: serve warns when pinned lanes hold every CPU the process
// may use, and only then.
func TestCrowdHint(t *testing.T) {
	pinned := func(n int, cpus ...int) sched.LaneSpec { return sched.LaneSpec{Threads: n, CPUs: cpus} }
	phone := cpuset.Set{0, 1, 2, 3, 4, 5, 6, 7}
	if got := crowdHint([]sched.LaneSpec{pinned(4, 4, 5, 6, 7), pinned(4, 0, 1, 2, 3)}, phone); !strings.Contains(got, "every CPU this process may use (0-7)") {
		t.Errorf("big and little lanes on all eight cores: %q", got)
	}
	if got := crowdHint([]sched.LaneSpec{pinned(1, 1), {Device: "cuda"}, pinned(1, 0)}, cpuset.Set{0, 1}); got == "" {
		t.Error("lanes on CPUs 1 and 0 of 0-1: no hint")
	}
	for name, specs := range map[string][]sched.LaneSpec{
		"a core left":              {pinned(3, 5, 6, 7), pinned(4, 0, 1, 2, 3)},
		"floating lanes":           {{Threads: 4}, {Threads: 4}},
		"one pinned, one floating": {pinned(4, 4, 5, 6, 7), {Threads: 4}},
	} {
		if got := crowdHint(specs, phone); got != "" {
			t.Errorf("%s: %q, want no hint", name, got)
		}
	}
}

// TestServeGPULaneWithoutCUDA: serve with a GPU lane in a build without
// -tags cuda exits with the model's error saying to rebuild, not a
// panic, also with a draft. (A cuda build serves it; runtime/sched's cuda tests cover that.)
func TestServeGPULaneWithoutCUDA(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f, model.Options{Threads: 1, Device: "cuda"})
	if err == nil {
		m.Close()
		t.Skip("this binary has the GPU backend")
	}
	code, _, stderr := tandem(t, "serve", "--addr", "127.0.0.1:0", "--model", path, "--lanes", "cuda,1")
	if code == 0 || !strings.Contains(stderr, "lane cuda0") || !strings.Contains(stderr, "-tags cuda") {
		t.Errorf("serve --lanes cuda,1: exit %d, stderr %q", code, stderr)
	}
	// With a draft, the lane's own failure is the lane's: it used to be
	// labelled --draft, blaming the wrong flag.
	code, _, stderr = tandem(t, "serve", "--addr", "127.0.0.1:0", "--model", path, "--lanes", "cuda",
		"--draft", testutil.Model(t, "llama2xs_model.bin"), "--draft-tokenizer", testutil.Model(t, "tok512.bin"))
	if code == 0 || !strings.Contains(stderr, "lane cuda0") || !strings.Contains(stderr, "-tags cuda") || strings.Contains(stderr, "--draft") {
		t.Errorf("serve --lanes cuda --draft: exit %d, stderr %q; want the lane's error, not --draft's", code, stderr)
	}
	// bench sched measures the GPU lane's costs first, so it fails at
	// once (no calibration is given: one would take minutes) and names
	// the lane.
	code, _, stderr = tandem(t, "bench", "sched", "--model", path, "--lanes", "1,cuda", "--sim-shape", "", "--loads", "1")
	if code == 0 || !strings.Contains(stderr, "lane 1 (cuda)") || !strings.Contains(stderr, "-tags cuda") || strings.Contains(stderr, "calibrating") {
		t.Errorf("bench sched --lanes 1,cuda: exit %d, stderr %q", code, stderr)
	}
	// calibrate loads its lanes before it generates anything.
	code, _, stderr = tandem(t, "calibrate", "--model", path, "--lanes", "cuda", "--out", filepath.Join(t.TempDir(), "c.json"))
	if code != 1 || !strings.Contains(stderr, "lane cuda0") || !strings.Contains(stderr, "-tags cuda") {
		t.Errorf("calibrate --lanes cuda: exit %d, stderr %q", code, stderr)
	}
}

// TestTurnsNotedByEveryCommandWithLanes: bench sched and calibrate note
// lanes with more threads than CPUs as serve does, before any work (here
// before a flag error and a missing model stop them).
func TestTurnsNotedByEveryCommandWithLanes(t *testing.T) {
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	n := min(len(allowed), sched.MaxLaneThreads)
	lanes := fmt.Sprintf("%d,%d", n, n) // twice the CPUs
	missing := filepath.Join(t.TempDir(), "missing.gguf")
	for _, args := range [][]string{
		{"bench", "sched", "--lanes", lanes, "--sim-threads", "0"},
		{"calibrate", "--lanes", lanes, "--model", missing, "--out", filepath.Join(t.TempDir(), "c.json")},
	} {
		_, _, errOut := tandem(t, args...)
		if want := fmt.Sprintf("run %d threads on the %d CPUs", 2*n, len(allowed)); !strings.Contains(errOut, want) {
			t.Errorf("%v: stderr %q; want the note saying %q", args, errOut, want)
		}
	}
}
