package mobile

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// TestLaneCPUs: lane_cpus names each lane's CPUs on a phone (little
// cores 0-3, big 4-7); alone it makes a lane per entry, a thread per CPU.
func TestLaneCPUs(t *testing.T) {
	defer func(old func(string) (cpuset.Set, error)) { namedCPUs = old }(namedCPUs)
	namedCPUs = cpuset.Topology{{CPUs: cpuset.Set{4, 5, 6, 7}, Capacity: 1024}, {CPUs: cpuset.Set{0, 1, 2, 3}, Capacity: 325}}.Named
	for _, tc := range []struct {
		cfg, want, err string
	}{
		{`{"lane_cpus": ["big", "little"]}`, "[4@4-7 4@0-3]", ""},
		{`{"lanes": [3, 2], "lane_cpus": ["big", ""]}`, "[3@4-7 2]", ""},
		{`{"threads": 2, "lane_cpus": ["6-7"]}`, "[2@6-7]", ""},
		{`{"lanes": [2, 2]}`, "[2 2]", ""},
		{`{"lanes": [2, 2], "lane_cpus": ["big"]}`, "", "1 entries for 2 lane(s)"},
		{`{"lanes": [5], "lane_cpus": ["little"]}`, "", "at most 4 threads"},
		{`{"lane_cpus": ["big", "mid"]}`, "", `lane_cpus[1] "mid"`},
		{`{"lane_cpus": ["0","1","2","3","4","5","6","7","0"]}`, "", "at most 8 lanes"},
		{`{"lane_cpus": ["0-270"]}`, "", "271 threads, one per CPU of 0-270; a lane takes at most 256"},
	} {
		var c config
		if err := json.Unmarshal([]byte(tc.cfg), &c); err != nil {
			t.Fatal(err)
		}
		specs, err := c.lanes()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.cfg, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, %v; want an error saying %q", tc.cfg, specs, err, tc.err)
		case tc.err == "" && fmt.Sprint(specs) != tc.want:
			t.Errorf("%s: lanes %v, want %s", tc.cfg, specs, tc.want)
		}
	}
}

// TestPinnedLanesMatchReference: two lanes pinned to this machine's
// first and last CPU give the reference text and report their CPUs,
// plain and speculative (the draft computes on its lane's pinned pool).
func TestPinnedLanesMatchReference(t *testing.T) {
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	first, last := cpuset.Set{allowed[0]}, cpuset.Set{allowed[len(allowed)-1]}
	pins := fmt.Sprintf(`"lane_cpus": [%q, %q]`, first, last)
	for _, tc := range []struct {
		name, cfg, tok string
	}{
		{"plain", fmt.Sprintf(`{"model": %q, %s}`, testutil.Model(t, "stories260K.gguf"), pins), "stories260K.gguf"},
		{"tree", fmt.Sprintf(`{"model": %q, "tokenizer": %q, "draft": %q, "context": 256, %s}`,
			testutil.Model(t, "stories260K.bin"), testutil.Model(t, "tok512.bin"), testutil.Model(t, "llama2xs_model.bin"), pins), "tok512.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.cfg)
			tok, err := tokenizer.Load(testutil.Model(t, tc.tok))
			if err != nil {
				t.Fatal(err)
			}
			rec := firstRecord(t, "stories260K.greedy.jsonl")
			const n = 40
			r := generate(t, e, fmt.Sprintf(`{"prompt": %q, "max_tokens": %d, "temperature": 0}`, rec.Prompt, n), nil)
			if want := referenceText(t, tok, rec, n); r.Text != want {
				t.Errorf("text %q\nwant %q", r.Text, want)
			}
			var st statsJSON
			if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
				t.Fatal(err)
			}
			if len(st.Lanes) != 2 || st.Lanes[0].CPUs != first.String() || st.Lanes[1].CPUs != last.String() || st.Lanes[0].Threads != 1 {
				t.Errorf("stats lanes %+v, want one thread each on %s and %s", st.Lanes, first, last)
			}
			if tc.name == "tree" && (st.Lanes[0].Spec == nil || st.Lanes[1].Spec == nil) {
				t.Errorf("speculative lanes without speculative stats: %+v", st.Lanes)
			}
		})
	}
}
