package budget

import (
	"errors"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// TestForLanes resolves every form of budget on stories260K, one lane and
// two, against the model's own stream plan.
func TestForLanes(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	probe, _, _ := model.PlanStream(f, weights.StreamOptions{Mode: weights.StreamPipelined, Method: weights.IOPread})
	if probe.Min == 0 || probe.Total <= probe.Min {
		t.Fatalf("stories260K's plan: min %d of %d bytes", probe.Min, probe.Total)
	}
	avail := func(n uint64, err error) func() (uint64, error) { return func() (uint64, error) { return n, err } }
	opt := Options{AutoShare: 0.5, Available: avail(8<<30, nil)}
	for _, tc := range []struct {
		budget string
		lanes  int
		opt    Options
		per    uint64 // each lane's budget; 0: resident
		note   string // in the note, or the error
		fails  bool
	}{
		{"", 2, opt, 0, "resident", false},
		{"min", 2, opt, probe.Min, "streamed", false},
		{"50%", 2, opt, probe.Total / 2, "streamed", false},
		{"100%", 1, opt, probe.Total, "the whole model, 1.1 MiB, fits and stays pinned", false},
		{"1GiB", 1, opt, 1 << 30, "fits and stays pinned", false},
		{"2MiB", 2, opt, 1 << 20, "1.0 MiB per lane", false},
		{"auto", 1, opt, 0, "the whole model fits, resident", false},
		{"auto", 2, Options{AutoShare: 0.5, Available: avail(2*probe.Total, nil)}, probe.Total / 2, "auto: 50%", false},
		{"auto", 1, Options{AutoShare: 0.5, Available: avail(0, errors.New("no /proc/meminfo"))}, 0, "give a size", true},
		{"1KiB", 1, opt, 0, "needs at least", true},
		{"0%", 1, opt, 0, "above 0%", true},
		{"150%", 1, opt, 0, "at most 100%", true},
		{"NaN%", 1, opt, 0, "like 25%", true},
		{"lots", 1, opt, 0, "or N% of the weights", true},
		{"min", 0, opt, 0, "at least one", true},
		{"min", 1, Options{Embedded: true}, 0, "embedded default model", true},
		{"auto", 1, Options{Embedded: true}, 0, "resident", false},
	} {
		p, err := ForLanes(f, tc.budget, tc.lanes, tc.opt)
		got := p.Note
		if err != nil {
			got = err.Error()
		}
		if (err != nil) != tc.fails || !strings.Contains(got, tc.note) {
			t.Errorf("%q over %d lanes: %q (error %v), want %q", tc.budget, tc.lanes, got, err != nil, tc.note)
			continue
		}
		var per uint64
		if p.Stream != nil {
			per = p.Stream.Budget
		}
		if !tc.fails && (per > tc.per || tc.per-per > 1) {
			t.Errorf("%q over %d lanes: %d bytes a lane, want %d", tc.budget, tc.lanes, per, tc.per)
		}
	}
}

// TestCheck: the budgets Check refuses without a model are the ones
// ForLanes refuses for their form, with the same words, and it passes
// every form ForLanes may accept.
func TestCheck(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opt := Options{AutoShare: 0.5, Available: func() (uint64, error) { return 8 << 30, nil }}
	for _, tc := range []struct {
		budget   string
		embedded bool
		err      string // "" passes
	}{
		{"", false, ""},
		{"", true, ""},
		{"auto", true, ""},
		{" Auto ", false, ""},
		{"min", false, ""},
		{"25%", false, ""},
		{"512MiB", false, ""},
		{"1KiB", false, ""}, // too small for this model: ForLanes says so
		{"min", true, "embedded default model"},
		{"5%", true, "embedded default model"},
		{"bogus", true, "or N% of the weights"}, // what is wrong with it first
		{"0%", true, "above 0%"},
		{"-5MiB", false, `"-5MiB"`}, // as written
		{"0%", false, "above 0%"},
		{"0", false, "holds no weights"},
		{"0MiB", false, "holds no weights"},
		{"NaN%", false, "like 25%"},
		{"lots", false, "or N% of the weights"},
		{"-1", false, "or N% of the weights"},
	} {
		err := Check(tc.budget, tc.embedded)
		if tc.err == "" {
			if err != nil {
				t.Errorf("Check(%q, %v) = %v, want nil", tc.budget, tc.embedded, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("Check(%q, %v) = %v, want an error saying %q", tc.budget, tc.embedded, err, tc.err)
			continue
		}
		o := opt
		o.Embedded = tc.embedded
		if _, ferr := ForLanes(f, tc.budget, 1, o); ferr == nil || ferr.Error() != err.Error() {
			t.Errorf("%q: Check says %v, ForLanes %v", tc.budget, err, ferr)
		}
	}
}

// FuzzForLanes: any budget string resolves or fails with an error, and a
// plan that streams gives each lane at least the model's minimum.
func FuzzForLanes(f *testing.F) {
	for _, s := range []string{"", "min", "auto", "25%", "1.5MiB", "-1", "1e400%", "0x10GB", " 12 KB "} {
		f.Add(s, uint8(1))
	}
	file, err := weights.Open(testutil.Model(f, "stories260K.gguf"))
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	probe, _, _ := model.PlanStream(file, weights.StreamOptions{Mode: weights.StreamPipelined, Method: weights.IOPread})
	f.Fuzz(func(t *testing.T, budget string, lanes uint8) {
		p, err := ForLanes(file, budget, int(lanes%5), Options{AutoShare: 0.6, Available: func() (uint64, error) { return 1 << 30, nil }})
		if err == nil && p.Stream != nil && p.Stream.Budget < probe.Min {
			t.Fatalf("%q over %d lanes: %d bytes a lane, below the minimum %d", budget, lanes%5, p.Stream.Budget, probe.Min)
		}
		// Check refuses only what ForLanes refuses too, in its words.
		if cerr := Check(budget, false); cerr != nil && (err == nil || err.Error() != cerr.Error()) && lanes%5 != 0 {
			t.Fatalf("%q: Check says %v, ForLanes %v", budget, cerr, err)
		}
	})
}
