package main

import (
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

type genJSON struct {
	IDs   []int32 `json:"ids"`
	Text  string  `json:"text"`
	Stats struct {
		Stream *streamStats `json:"stream"`
	} `json:"stats"`
}

func generateJSON(t *testing.T, args ...string) (genJSON, string) {
	t.Helper()
	code, out, errOut := tandem(t, append([]string{"generate", "--json", "--max-tokens", "24"}, args...)...)
	if code != 0 {
		t.Fatalf("generate %v: exit %d: %s", args, code, errOut)
	}
	var g genJSON
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return g, errOut
}

// TestGenerateStreamed runs generate under budgets in every mode and
// method: the text is the resident model's, the stats hold to the
// budget, and --budget min says what it chose.
func TestGenerateStreamed(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	ref, _ := generateJSON(t, "--model", path)
	if ref.Stats.Stream != nil {
		t.Fatal("resident run reports stream stats")
	}
	for _, tc := range []struct {
		name string
		args []string
		note string
	}{
		{"min-stdpl", []string{"--budget", "min"}, "budget min:"},
		{"min-std-mmap", []string{"--budget", "min", "--mode", "std", "--io", "mmap"}, "pins nothing"},
		{"half-throttled", []string{"--budget", "600KB", "--io-bandwidth", "2GB/s", "--io-latency", "20us"}, ""},
		{"all", []string{"--budget", "64MiB", "--mode", "std"}, ""},
		{"share", []string{"--budget", "80%"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, errOut := generateJSON(t, append([]string{"--model", path}, tc.args...)...)
			if g.Text != ref.Text {
				t.Errorf("streamed text %q, resident %q", g.Text, ref.Text)
			}
			s := g.Stats.Stream
			if s == nil {
				t.Fatal("no stream stats")
			}
			if s.PeakResidentBytes > s.BudgetBytes || s.BudgetBytes == 0 {
				t.Errorf("peak resident %d, budget %d", s.PeakResidentBytes, s.BudgetBytes)
			}
			if tc.note != "" && !strings.Contains(errOut, tc.note) {
				t.Errorf("stderr %q does not say %q", errOut, tc.note)
			}
			if tc.name == "share" {
				f, err := weights.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				probe, _, _ := model.PlanStream(f, weights.StreamOptions{})
				f.Close()
				if want := uint64(float64(probe.Total) * 0.8); s.BudgetBytes != want {
					t.Errorf("--budget 80%% of %d bytes gave %d, want %d", probe.Total, s.BudgetBytes, want)
				}
			}
			if tc.name == "all" && (s.BytesRead != 0 || s.PinnedBytes == 0) {
				t.Errorf("a budget above the model pinned %d and read %d bytes after warm-up", s.PinnedBytes, s.BytesRead)
			}
			if tc.name != "all" && (s.BytesReadPerToken == 0 || s.Passes == 0) {
				t.Errorf("streamed %d bytes per token over %d passes", s.BytesReadPerToken, s.Passes)
			}
		})
	}
	// Text output carries the stream line.
	code, _, errOut := tandem(t, "generate", "--model", path, "--max-tokens", "4", "--budget", "min")
	if code != 0 || !strings.Contains(errOut, "stream stdpl/pread") || !strings.Contains(errOut, "IO stall") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

func TestGenerateRunFlagErrors(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--budget", "1KiB"}, 1, "needs at least"},
		{[]string{"--budget", "lots"}, 2, "--budget"},
		{[]string{"--budget", "0%"}, 2, "above 0% and at most 100%"},
		{[]string{"--budget", "0"}, 2, "--budget 0 holds no weights"},
		{[]string{"--device", "tpu"}, 2, `--device: model: unknown device "tpu"`},
		{[]string{"--budget", "150%"}, 2, "above 0% and at most 100%"},
		{[]string{"--mode", "turbo"}, 2, "want one of resident|target|std|stdpl|sd|bild|tree"},
		{[]string{"--mode", "resident", "--budget", "1MiB"}, 2, "need a streaming mode"},
		{[]string{"--io-bandwidth", "400MB/s"}, 2, "need a streaming mode"},
		{[]string{"--budget", "min", "--io-bandwidth", "fast"}, 2, "--io-bandwidth"},
		{[]string{"--budget", "min", "--io-latency", "soon"}, 2, "--io-latency"},
		{[]string{"--budget", "min", "--io", "dma"}, 2, "pread or mmap"},
	} {
		code, _, errOut := tandem(t, append([]string{"generate", "--model", path, "--max-tokens", "2"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want exit %d saying %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	if code, _, errOut := tandem(t, "generate", "--budget", "min"); code != 2 || !strings.Contains(errOut, "embedded model") {
		t.Errorf("embedded model with a budget: exit %d, %q", code, errOut)
	}
}

// TestBudgetAuto checks --budget auto takes its share of the available
// memory the probe reports, and says so.
func TestBudgetAuto(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		avail uint64
		err   error
		want  uint64
	}{
		{1 << 30, nil, 644245094}, // 60% of 1 GiB
		{64 << 10, nil, 0},        // 60% of 64 KiB is below the model's minimum
		{0, errors.New("no /proc"), 0},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		rf := addRunFlags(fs)
		if err := fs.Parse([]string{"--budget", "auto"}); err != nil {
			t.Fatal(err)
		}
		rf.available = func() (uint64, error) { return tc.avail, tc.err }
		var note strings.Builder
		rc, err := rf.resolve(f, false, &note)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("available %d (%v): no error", tc.avail, tc.err)
			}
			continue
		}
		if err != nil || rc.stream == nil || rc.stream.Budget != tc.want || rc.mode.name != "stdpl" {
			t.Fatalf("available %d: %+v, %v; want budget %d in stdpl", tc.avail, rc.stream, err, tc.want)
		}
		if !strings.Contains(note.String(), "budget auto") {
			t.Errorf("note %q", note.String())
		}
	}
}
