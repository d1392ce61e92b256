package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
)

// calibrateSmall runs tandem calibrate on stories260K with a small corpus
// and returns the file it wrote.
func calibrateSmall(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "stories260K.calib.json")
	code, stdout, stderr := tandem(t, "calibrate", "--model", testutil.Model(t, "stories260K.gguf"),
		"--n", "40", "--max-tokens", "64", "--epochs", "100", "--lanes", "1", "--out", out)
	if code != 0 {
		t.Fatalf("calibrate: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"MLP on features", "prompt length (fallback)", "wrote " + out} {
		if !strings.Contains(stdout, want) {
			t.Errorf("calibrate output lacks %q:\n%s", want, stdout)
		}
	}
	return out
}

func TestCalibrate(t *testing.T) {
	path := calibrateSmall(t)
	c, err := sched.LoadCalibration(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Samples != 40 || c.Model != "stories260K.gguf" || c.Validation.N != 8 || len(c.Scores) != 21 {
		t.Errorf("calibration %+v", c)
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"few.txt":  "one\ntwo\n",
		"bad.json": strings.Repeat(`{"prompt":"x","max_tokens":"many"}`+"\n", 12),
		"long.txt": strings.Repeat("short\n", 12) + strings.Repeat("a", 2<<20) + "\n", // said the scanner's "token too long" alone
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		if code, _, stderr := tandem(t, "calibrate", "--model", testutil.Model(t, "stories260K.gguf"), "--prompts", p, "--out", filepath.Join(dir, "c.json")); code != 1 || !strings.Contains(stderr, name) {
			t.Errorf("%s: exit %d: %s", name, code, stderr)
		}
	}
	if code, _, stderr := tandem(t, "calibrate", "--model", testutil.Model(t, "stories260K.gguf"), "--prompts", filepath.Join(dir, "few.txt"), "--out", filepath.Join(dir, "c.json")); code != 1 || !strings.Contains(stderr, "few.txt holds 2 of the 10 prompts calibration needs") {
		t.Errorf("two prompts: exit %d: %s", code, stderr)
	}
	if code, _, stderr := tandem(t, "calibrate", "--model", testutil.Model(t, "stories260K.gguf"), "--prompts", filepath.Join(dir, "long.txt"), "--out", filepath.Join(dir, "c.json")); code != 1 || !strings.Contains(stderr, "long.txt:13: a line over 1 MiB") {
		t.Errorf("a 2 MiB line: exit %d: %s", code, stderr)
	}
	// --n takes the first N of a prompt file (its help's example), not
	// only of the built-in corpus.
	lines := filepath.Join(dir, "fourteen.txt")
	os.WriteFile(lines, []byte(strings.Repeat("Tell me a story about a cat.\n", 14)), 0o644)
	out := filepath.Join(dir, "n.json")
	if code, _, stderr := tandem(t, "calibrate", "--model", testutil.Model(t, "stories260K.gguf"), "--prompts", lines, "--n", "11",
		"--max-tokens", "8", "--epochs", "10", "--lanes", "1", "--out", out); code != 0 {
		t.Fatalf("--n 11 of 14 prompts: exit %d: %s", code, stderr)
	}
	if c, err := sched.LoadCalibration(out); err != nil || c.Samples != 11 {
		t.Errorf("--n 11 of 14 prompts: calibration on %d generations (%v), want 11", c.Samples, err)
	}
	if code, _, _ := tandem(t, "calibrate", "--n", "0"); code != 2 {
		t.Errorf("--n 0: exit %d, want 2", code)
	}
	if code, _, stderr := tandem(t, "calibrate", "--lanes", "0,1"); code != 2 || !strings.Contains(stderr, "cuda / cuda:N") {
		t.Errorf("--lanes 0,1: exit %d, want 2 and what a lane is: %s", code, stderr)
	}
}

// TestBenchSchedSimLanesThatDiffer: --sim-costs with a triple per lane
// simulates lanes of those costs (the floors included), and a lane's
// triple that is not three numbers is a usage error naming the form.
func TestBenchSchedSimLanesThatDiffer(t *testing.T) {
	code, stdout, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "50,10,1/150,300,3", "--sim-requests", "40",
		"--loads", "1.5", "--adversarial", "0.2", "--policies", "tandem,fifo", "--ablate=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"lane 0 50ms + 10ms/member + 1ms/prefill token, lane 1 150ms + 300ms/member + 3ms/prefill token", "| sim |", "p99 FIFO → tandem"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if code, _, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "50,10,1/150,300"); code != 2 || !strings.Contains(stderr, "lanes separated by /") {
		t.Errorf("a lane of two numbers: exit %d, %q", code, stderr)
	}
}

// TestBenchSimContextCost: a fourth number in --sim-costs prices each
// member's context, and the simulator's load then comes from what the
// lanes decode at the workload's mean context: fewer requests a second
// than for the same lanes at no context.
func TestBenchSimContextCost(t *testing.T) {
	reqRate := func(costs string) (float64, string) {
		t.Helper()
		code, stdout, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", costs, "--sim-requests", "40",
			"--loads", "1.5", "--adversarial", "0.4", "--policies", "fifo", "--ablate=false")
		if code != 0 {
			t.Fatalf("--sim-costs %s: exit %d: %s", costs, code, stderr)
		}
		for _, line := range strings.Split(stdout, "\n") {
			if f := strings.Split(line, "|"); len(f) > 6 && strings.TrimSpace(f[1]) == "sim" && strings.TrimSpace(f[6]) == "fifo" {
				r, err := strconv.ParseFloat(strings.TrimSpace(f[5]), 64)
				if err != nil {
					t.Fatalf("req/s %q: %v", f[5], err)
				}
				return r, stdout
			}
		}
		t.Fatalf("no fifo row:\n%s", stdout)
		return 0, ""
	}
	flat, _ := reqRate("0.025,0.033,0.0188")
	priced, out := reqRate("0.025,0.033,0.0188,0.000086")
	if !strings.Contains(out, "25µs + 33µs/member + 86ns/member/context token + 18.8µs/prefill token") {
		t.Errorf("the note does not give the context cost:\n%s", out)
	}
	// Adversarial answers run to 448 tokens, so the mean context is in
	// the hundreds: a member costs a third to twice as much again.
	if priced >= 0.9*flat || priced < 0.4*flat {
		t.Errorf("%.1f requests a second with context priced, %.1f without: want between 0.4 and 0.9 times", priced, flat)
	}
	if code, _, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "1,2,3,4,5"); code != 2 || !strings.Contains(stderr, "A,B,C[,D]") {
		t.Errorf("five numbers: exit %d, %q", code, stderr)
	}
}

// TestSimTokenTimeIsWhatALoneRequestTakes: the simulated workload's
// deadlines are in units of what the simulator gives one request alone
// for 64 tokens from a short prompt, as the real engine's are in what
// LiveTokenTime measures there; a member's cost at no context would be
// 40% short of it with this context cost.
func TestSimTokenTimeIsWhatALoneRequestTakes(t *testing.T) {
	c := bench.StepCosts{A: 2500 * time.Microsecond, B: 3300 * time.Microsecond, C: 1900 * time.Microsecond, D: 100 * time.Microsecond, MaxSeqs: 16, Context: 2048}
	req := bench.WorkRequest{ID: "alone", Prompt: "Once upon a time", MaxTokens: 64, Natural: 64}
	run, err := bench.Simulate([]bench.WorkRequest{req}, bench.SimConfig{Sched: sched.Config{MaxQueue: 2}, Lanes: []bench.StepCosts{c}})
	if err != nil {
		t.Fatal(err)
	}
	// The simulator also charges the scheduler's own wall time, well
	// below 1% at steps of milliseconds even under the race detector.
	alone := run.Outcomes[0].Response / 64
	if got := simTokenTime(c); math.Abs(float64(got-alone)) > 0.03*float64(alone) {
		t.Errorf("deadline unit %v, but one request alone takes %v a token", got, alone)
	}
}

// TestCalibrationLanes: bench sched calibrates in memory on its own lanes
// when one is a GPU, else on a CPU lane per core.
func TestCalibrationLanes(t *testing.T) {
	gpu := []sched.LaneSpec{{Device: "cuda"}, {Threads: 4}}
	if got := calibrationLanes(gpu); fmt.Sprint(got) != fmt.Sprint(gpu) {
		t.Errorf("with a GPU lane: %v", got)
	}
	got := calibrationLanes([]sched.LaneSpec{{Threads: 4}})
	if len(got) != kernels.PhysicalCores() || slices.ContainsFunc(got, func(l sched.LaneSpec) bool { return l.GPU() || l.Threads != 1 }) {
		t.Errorf("CPU lanes only: %v, want one 1-thread lane per core", got)
	}
}

func TestBenchSchedSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real engine for a few seconds")
	}
	calib := calibrateSmall(t)
	out := t.TempDir()
	code, stdout, stderr := tandem(t, "bench", "sched", "--model", testutil.Model(t, "stories260K.gguf"), "--calibration", calib,
		"--requests", "20", "--repeat", "2", "--loads", "1", "--adversarial", "0.2", "--policies", "tandem,fifo,tandem-route",
		"--sim-costs", "50,10,1", "--sim-requests", "40", "--out", out, "--outcomes", filepath.Join(out, "outcomes.jsonl"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"| real stories260K |", "| sim |", "| tandem |", "| fifo |", "tandem -shed", "p99 FIFO → tandem", "median of 2 runs", "| tandem -route |", "tokens on average, the workload asks", "at load 1.00 the floors' rates, at the answers' mean context of", "/member/context token", "the clients submitted up to"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	// Every prompt starts with BOS at least, which a finished request's
	// rows hold.
	if m := regexp.MustCompile(`prefix reuse took ([0-9.]+)% of the runs' prompt tokens`).FindStringSubmatch(stdout); m == nil || m[1] == "0.0" {
		t.Errorf("output lacks the prefix reuse's share, or it is zero: %v\n%s", m, stdout)
	}
	var rows []map[string]any
	data, err := os.ReadFile(filepath.Join(out, "sched.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rows); err != nil || len(rows) != 3+5 { // real: three policies; sim: those, -shed and -admit
		t.Errorf("sched.json: %d rows, %v", len(rows), err)
	}
	for _, r := range rows {
		real := strings.HasPrefix(r["Engine"].(string), "real")
		if real != (r["Runs"] == 2.0) {
			t.Errorf("row %v %v: runs %v, want the real engine's rows to be medians of 2", r["Engine"], r["Policy"], r["Runs"])
		}
		// Every row carries both floors: the simulator's from the
		// workload, the real engine's from the answers the model gave at
		// the capacity it measured.
		p99Floor, maxFloor := r["P99Floor"].(float64), r["MaxFloor"].(float64)
		if p99Floor <= 0 || maxFloor < p99Floor {
			t.Errorf("row %v %v: p99 floor %v, slowest-response floor %v", r["Engine"], r["Policy"], p99Floor, maxFloor)
		}
		// The real engine's rows have them again at the fastest rate its
		// runs decoded; the simulator's runs decode at the costs given.
		runP99, runMax := r["RunP99Floor"].(float64), r["RunMaxFloor"].(float64)
		if real && (runP99 <= 0 || runMax < runP99) || !real && (runP99 != 0 || runMax != 0) {
			t.Errorf("row %v %v: floors at the runs' best rate %v and %v", r["Engine"], r["Policy"], runP99, runMax)
		}
		// Every row splits its overhead: the lanes' part and the
		// intake's (scoring every request) are both some of it.
		if lanes, all := r["LaneOverhead"].(float64), r["Overhead"].(float64); lanes <= 0 || lanes >= all {
			t.Errorf("row %v %v: lanes' overhead %v of %v", r["Engine"], r["Policy"], lanes, all)
		}
		// And per request, and the batches it paid per step for.
		if r["SchedPerRequest"].(float64) <= 0 || r["TokensPerStep"].(float64) <= 0 || r["TokensPerStep"].(float64) > 8 {
			t.Errorf("row %v %v: scheduler time per request %v, tokens per step %v", r["Engine"], r["Policy"], r["SchedPerRequest"], r["TokensPerStep"])
		}
		if r["Max"].(float64) < r["P99"].(float64) {
			t.Errorf("row %v %v: slowest response %v below the p99 %v", r["Engine"], r["Policy"], r["Max"], r["P99"])
		}
	}
	checkOutcomes(t, filepath.Join(out, "outcomes.jsonl"), rows)
	for _, f := range []string{"sched.md", "sched.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// Turned off, the lanes prefill every prompt whole.
	code, stdout, stderr = tandem(t, "bench", "sched", "--model", testutil.Model(t, "stories260K.gguf"), "--calibration", calib,
		"--requests", "10", "--repeat", "1", "--loads", "1", "--adversarial", "0", "--policies", "fifo", "--sim-shape", "", "--prefix-reuse=false")
	if code != 0 || !strings.Contains(stdout, "prefix reuse took 0.0% of the runs' prompt tokens") {
		t.Errorf("--prefix-reuse=false: exit %d, output lacks a zero share:\n%s\n%s", code, stdout, stderr)
	}
	if code, _, _ := tandem(t, "bench", "sched", "--loads", "x"); code != 2 {
		t.Errorf("bad --loads: exit %d", code)
	}
	if code, _, stderr := tandem(t, "bench", "sched", "--policies", "tandem-fast"); code != 2 || !strings.Contains(stderr, "tandem-route") {
		t.Errorf("unknown policy: exit %d: %s", code, stderr)
	}
	if code, _, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "0,0,5"); code != 2 || !strings.Contains(stderr, "above 0") {
		t.Errorf("free simulated steps: exit %d, %q", code, stderr)
	}
	if code, _, _ := tandem(t, "bench", "sched", "--repeat", "0"); code != 2 {
		t.Errorf("--repeat 0: exit %d", code)
	}
	// An output that cannot be written is bad usage, said before the runs.
	if code, _, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "50,10,1", "--outcomes", filepath.Join(out, "no", "such", "dir")); code != 2 || !strings.Contains(stderr, "--outcomes") {
		t.Errorf("--outcomes in a missing directory: exit %d, %q", code, stderr)
	}
	// Flags of a part the run skips.
	for _, args := range [][]string{
		{"--real=false", "--sim-costs", "50,10,1", "--model", "nosuch.gguf"},
		{"--real=false", "--sim-costs", "50,10,1", "--repeat", "7"},
		{"--real=false", "--sim-costs", "50,10,1", "--sim-shape", "stories15m"},
		{"--real=false", "--sim-costs", "50,10,1", "--policies", "tandem,fifo,tandem"},
	} {
		if code, _, stderr := tandem(t, append([]string{"bench", "sched"}, args...)...); code != 2 || !strings.Contains(stderr, "--") {
			t.Errorf("%v: exit %d, %q; want 2", args, code, stderr)
		}
	}
}

// checkOutcomes reads what TestBenchSchedSmall's --outcomes wrote: the
// real engine's 20 requests for each of its 2 runs of 3 policies, and
// the simulator's 40 for each of its 5, each request once per run, with
// times and tokens that agree; the simulator's rows (one run each) have
// the deadline attainment their requests give.
func checkOutcomes(t *testing.T, path string, rows []map[string]any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Written to a temporary file (0600) and renamed: readable as a file
	// the command wrote itself would be.
	if fi, err := os.Stat(path); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o644 {
		t.Errorf("%s: mode %v, want -rw-r--r--", path, fi.Mode())
	}
	if left, _ := filepath.Glob(path + ".tmp*"); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	type key struct {
		engine, policy string
		run            int
	}
	ids := map[key]map[string]bool{}
	met, deadlines := map[key]int{}, map[key]int{}
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		var r bench.OutcomeRecord
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		k := key{r.Engine, r.Policy, r.Run}
		if ids[k] == nil {
			ids[k] = map[string]bool{}
		}
		if ids[k][r.ID] {
			t.Errorf("%v: request %s twice", k, r.ID)
		}
		ids[k][r.ID] = true
		if r.Load != 1 || r.Adversarial != 0.2 || r.Class == "" || r.Reason == "" || r.Lane < 0 || r.Lane > 1 || r.Score <= 0 {
			t.Errorf("line %d: %+v", i+1, r)
		}
		// A request shed whole before its first token has none.
		noToken := r.Generated == 0 && r.Shed == r.MaxTokens && r.FirstTokenS == nil
		if !noToken && (r.FirstTokenS == nil || *r.FirstTokenS < 0 || *r.FirstTokenS > r.ResponseS || r.Generated < 1) || r.Generated+r.Shed > r.MaxTokens || r.PromptTokens < 1 {
			t.Errorf("line %d: first token %v, response %v, %d generated + %d shed of %d, %d prompt tokens", i+1, r.FirstTokenS, r.ResponseS, r.Generated, r.Shed, r.MaxTokens, r.PromptTokens)
		}
		if (r.DeadlineMS > 0) != (r.DeadlineMet != nil) {
			t.Errorf("line %d: deadline %v ms, met %v", i+1, r.DeadlineMS, r.DeadlineMet)
		}
		if r.DeadlineMet != nil {
			deadlines[k]++
			if *r.DeadlineMet {
				met[k]++
			}
		}
	}
	want := map[key]int{}
	for _, p := range []string{"tandem", "fifo", "tandem -route"} {
		for run := range 2 {
			want[key{"real stories260K", p, run}] = 20
		}
	}
	for _, p := range []string{"tandem", "fifo", "tandem -route", "tandem -shed", "tandem -admit"} {
		want[key{"sim", p, 0}] = 40
	}
	for k, n := range want {
		if len(ids[k]) != n {
			t.Errorf("%v: %d requests, want %d", k, len(ids[k]), n)
		}
	}
	if len(ids) != len(want) {
		t.Errorf("%d runs written, want %d", len(ids), len(want))
	}
	for _, r := range rows {
		k := key{r["Engine"].(string), r["Policy"].(string), 0}
		if k.engine != "sim" {
			continue
		}
		if deadlines[k] != int(r["Deadlines"].(float64)) || deadlines[k] == 0 || math.Abs(100*float64(met[k])/float64(deadlines[k])-r["Attainment"].(float64)) > 1e-9 {
			t.Errorf("%v: %d of %d deadlines met in its requests; its row: %v of %v", k, met[k], deadlines[k], r["Attainment"], r["Deadlines"])
		}
	}
}

// TestFastLanes: a GPU lane beside a CPU lane measures the answers alone;
// lanes alike in speed (within 1.5×) all do.
func TestFastLanes(t *testing.T) {
	gpu := bench.StepCosts{A: 8 * time.Millisecond, B: 500 * time.Microsecond}
	cpu := bench.StepCosts{A: 30 * time.Millisecond, B: 40 * time.Millisecond}
	big := bench.StepCosts{A: time.Millisecond, B: 10 * time.Millisecond}
	little := bench.StepCosts{A: time.Millisecond, B: 14 * time.Millisecond}
	for _, c := range []struct {
		costs []bench.StepCosts
		want  []int
	}{
		{[]bench.StepCosts{gpu, cpu}, []int{0}},
		{[]bench.StepCosts{cpu, gpu}, []int{1}},
		{[]bench.StepCosts{big, little, big}, []int{0, 1, 2}},
		{[]bench.StepCosts{big, cpu}, []int{0}},
	} {
		if got := fastLanes(c.costs, 8); !slices.Equal(got, c.want) {
			t.Errorf("fastLanes(%v) = %v, want %v", c.costs, got, c.want)
		}
	}
}

// TestLoadEstimator: the embedded model comes calibrated, a calibration
// the user made for it (tandem calibrate, no --model) wins over the
// shipped one, a model file uses the calibration beside it when there is
// one (saying so when it was made for another file) and the prompt
// length when not, and a damaged file is an error, not a silent fallback.
func TestLoadEstimator(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	est, name, err := loadEstimator("", "")
	if err != nil || !est.Calibrated() || name != defaultmodel.CalibrationName {
		t.Fatalf("embedded model: calibrated %v from %q, %v", est.Calibrated(), name, err)
	}
	own, err := calibrationPath("")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := sched.ParseCalibration(defaultmodel.Calibration(), defaultmodel.CalibrationName)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(own), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := shipped.Save(own); err != nil {
		t.Fatal(err)
	}
	if est, name, err := loadEstimator("", ""); err != nil || !est.Calibrated() || name != own {
		t.Errorf("embedded model with the user's calibration: calibrated %v from %q, %v; want %s", est.Calibrated(), name, err, own)
	}

	model := filepath.Join(t.TempDir(), "model.gguf")
	if est, name, err := loadEstimator("", model); err != nil || est.Calibrated() || name != "" {
		t.Errorf("a model without calibration: calibrated %v from %q, %v", est.Calibrated(), name, err)
	}
	if err := shipped.Save(sched.CalibrationPath(model)); err != nil {
		t.Fatal(err)
	}
	if est, name, err := loadEstimator("", model); err != nil || !est.Calibrated() || name != sched.CalibrationPath(model) {
		t.Errorf("a model with its calibration beside it: calibrated %v from %q, %v", est.Calibrated(), name, err)
	}
	// The shipped calibration records the embedded target's size.
	os.WriteFile(model, []byte("a different model"), 0o644)
	if est, name, err := loadEstimator("", model); err != nil || !est.Calibrated() || !strings.Contains(name, fmt.Sprintf("made for a %d-byte model, this one has 17 bytes: rerun tandem calibrate", shipped.ModelBytes)) {
		t.Errorf("a model that is not the one calibrated: calibrated %v from %q, %v", est.Calibrated(), name, err)
	}
	os.WriteFile(own, []byte(`{"format":"tandem-calibration/1"}`), 0o644)
	if _, _, err := loadEstimator("", ""); err == nil || !strings.Contains(err.Error(), own) {
		t.Errorf("a damaged user calibration: %v, want an error naming %s", err, own)
	}
}

// TestCalibrateEmbeddedForANewUser: the embedded model's calibration goes
// to the user config directory, which a new user does not have yet.
func TestCalibrateEmbeddedForANewUser(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	code, stdout, stderr := tandem(t, "calibrate", "--n", "12", "--max-tokens", "8", "--epochs", "10", "--lanes", "1")
	want := filepath.Join(home, ".config", "tandem", "default.calib.json")
	if code != 0 || !strings.Contains(stdout, "wrote "+want) {
		t.Fatalf("calibrate: exit %d, stdout %q, stderr %q; want %s written", code, stdout, stderr, want)
	}
	if _, err := sched.LoadCalibration(want); err != nil {
		t.Error(err)
	}
}

// TestBenchSchedWithoutFIFO: the goal table compares tandem with FIFO; a
// run without FIFO says why it has none instead of printing it empty.
func TestBenchSchedWithoutFIFO(t *testing.T) {
	code, stdout, stderr := tandem(t, "bench", "sched", "--real=false", "--sim-costs", "50,10,1", "--sim-requests", "40",
		"--loads", "1", "--adversarial", "0", "--policies", "tandem,edf", "--ablate=false")
	if code != 0 || !strings.Contains(stdout, "No goal table") || strings.Contains(stdout, "tandem against FIFO") {
		t.Errorf("exit %d, %s\n%s", code, stderr, stdout)
	}
}

// TestShellLine: the report's command line pastes back as it was given,
// an empty --sim-shape included.
func TestShellLine(t *testing.T) {
	got := shellLine([]string{"--sim-shape", "", "--loads", "1.6", "--model", "my model.gguf", "--x", "it's"})
	if want := `--sim-shape '' --loads 1.6 --model 'my model.gguf' --x 'it'\''s'`; got != want {
		t.Errorf("shellLine = %s, want %s", got, want)
	}
}
