package cpuset

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Set
		str  string
	}{
		{"0", Set{0}, "0"},
		{"0-3", Set{0, 1, 2, 3}, "0-3"},
		{"0-3,6", Set{0, 1, 2, 3, 6}, "0-3,6"},
		{" 6, 0-2 ,1\n", Set{0, 1, 2, 6}, "0-2,6"},
		{"4-4,7,5", Set{4, 5, 7}, "4-5,7"},
		{"1023", Set{1023}, "1023"},
		{"8191", Set{8191}, "8191"},
		{"0-1,4,6-7\n", Set{0, 1, 4, 6, 7}, "0-1,4,6-7"},
	} {
		got, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) || got.String() != tc.str {
			t.Errorf("Parse(%q) = %v (%q), want %v (%q)", tc.in, got, got.String(), tc.want, tc.str)
		}
	}
	if s := (Set{0, 1, 2, 6}); !s.Has(6) || s.Has(3) || !s.Contains(Set{1, 6}) || s.Contains(Set{1, 7}) || s.Where() != " on CPUs 0-2,6" || Set(nil).Where() != "" {
		t.Errorf("Has, Contains or Where wrong on %v", s)
	}
	// Repeats stay a set of at most MaxCPU+1, however long the list.
	if s, err := Parse(strings.Repeat("0-8191,", 1000) + "0"); err != nil || len(s) != MaxCPU+1 {
		t.Errorf("a repeated full range: %d CPUs, %v", len(s), err)
	}
	for _, bad := range []string{"", " ", "a", "1-", "-1", "3-1", "1,,2", "8192", "0-4000000000", "99999999999999999", "1.5", "0-x"} {
		if s, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, s)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0-3,6", "0", "7-4", "1,1,1", "1023", "-", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := Parse(s)
		if err != nil {
			return
		}
		if len(got) == 0 || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("Parse(%q) = %v: not a sorted set", s, got)
		}
		again, err := Parse(got.String())
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("Parse(%q).String() = %q reads back as %v, %v", s, got.String(), again, err)
		}
	})
}

// fakeCPUs writes a sysfs CPU directory: online CPUs and, per CPU, the
// files given (relative to cpuN).
func fakeCPUs(t *testing.T, online string, files map[int]map[string]string) string {
	tree := map[string]string{"online": online}
	for c, fs := range files {
		for name, body := range fs {
			tree[fmt.Sprintf("cpu%d/%s", c, name)] = body
		}
	}
	return testutil.WriteTree(t, tree)
}

// TestUnionAndText: a union is ascending without repeats, and a set
// reads and writes as a CPU list in JSON.
func TestUnionAndText(t *testing.T) {
	if got := Union(Set{4, 5}, nil, Set{0, 5, 7}, Set{1}); !slices.Equal(got, Set{0, 1, 4, 5, 7}) {
		t.Errorf("Union = %v, want 0-1,4-5,7", got)
	}
	if got := Union(); got != nil {
		t.Errorf("Union() = %v, want nil", got)
	}
	b, err := json.Marshal(struct {
		CPUs Set `json:"cpus"`
	}{Set{0, 1, 2, 6}})
	if err != nil || string(b) != `{"cpus":"0-2,6"}` {
		t.Errorf("JSON %s, %v; want {\"cpus\":\"0-2,6\"}", b, err)
	}
	var back struct{ CPUs Set }
	if err := json.Unmarshal([]byte(`{"CPUs":"0-2,6"}`), &back); err != nil || !slices.Equal(back.CPUs, Set{0, 1, 2, 6}) {
		t.Errorf("read back %v, %v", back.CPUs, err)
	}
	if err := json.Unmarshal([]byte(`{"CPUs":""}`), &back); err != nil || back.CPUs != nil {
		t.Errorf("empty list: %v, %v; want the empty set", back.CPUs, err)
	}
	if err := json.Unmarshal([]byte(`{"CPUs":"3-1"}`), &back); err == nil {
		t.Error("a backwards range was read")
	}
}

func TestClusters(t *testing.T) {
	// A phone: four little cores, three big, one prime (Snapdragon-like),
	// capacities as its kernel writes them.
	phone := map[int]map[string]string{}
	for c := range 8 {
		capacity := "325"
		switch {
		case c == 7:
			capacity = "1024"
		case c >= 4:
			capacity = "870"
		}
		phone[c] = map[string]string{"cpu_capacity": capacity, "cpufreq/cpuinfo_max_freq": "1800000"}
	}
	cl, err := ClustersAt(fakeCPUs(t, "0-7", phone))
	if err != nil {
		t.Fatal(err)
	}
	want := Topology{{Set{7}, 1024}, {Set{4, 5, 6}, 870}, {Set{0, 1, 2, 3}, 325}}
	if !slices.EqualFunc(cl, want, func(a, b Cluster) bool { return slices.Equal(a.CPUs, b.CPUs) && a.Capacity == b.Capacity }) {
		t.Fatalf("clusters %v, want %v", cl, want)
	}
	if big, err := cl.Named("big"); err != nil || big.String() != "4-7" {
		t.Errorf("big = %v, %v; want 4-7", big, err)
	}
	if little, err := cl.Named("little"); err != nil || little.String() != "0-3" {
		t.Errorf("little = %v, %v; want 0-3", little, err)
	}

	// An older kernel without cpu_capacity: the highest clock ranks them.
	// CPU 5 is offline and left out.
	old := map[int]map[string]string{}
	for c := range 6 {
		freq := "1400000"
		if c >= 2 {
			freq = "2400000"
		}
		old[c] = map[string]string{"cpufreq/cpuinfo_max_freq": freq}
	}
	cl, err = ClustersAt(fakeCPUs(t, "0-4", old))
	if err != nil {
		t.Fatal(err)
	}
	if len(cl) != 2 || cl[0].CPUs.String() != "2-4" || cl[1].CPUs.String() != "0-1" || cl[0].Capacity != 2400000 {
		t.Fatalf("clusters by clock %v, want 2-4 then 0-1", cl)
	}

	// Alike cores: one cluster, and no big or little to name.
	alike := map[int]map[string]string{0: {"cpu_capacity": "1024"}, 1: {"cpu_capacity": "1024"}}
	cl, err = ClustersAt(fakeCPUs(t, "0-1", alike))
	if err != nil || len(cl) != 1 {
		t.Fatalf("alike cores: %v, %v; want one cluster", cl, err)
	}
	if _, err := cl.Named("big"); err == nil || !strings.Contains(err.Error(), "name CPUs instead") {
		t.Errorf("big on alike cores: %v, want an error saying to name CPUs", err)
	}

	// Capacities a few units apart are one cluster, at its slowest's.
	near := map[int]map[string]string{0: {"cpu_capacity": "1024"}, 1: {"cpu_capacity": "1019"}, 2: {"cpu_capacity": "1024"}}
	if cl, err = ClustersAt(fakeCPUs(t, "0-2", near)); err != nil || len(cl) != 1 || cl[0].CPUs.String() != "0-2" || cl[0].Capacity != 1019 {
		t.Errorf("near capacities: %v, %v; want one cluster 0-2 at 1019", cl, err)
	}
	// One source for every CPU: a capacity on some and clocks on all
	// rank by clock; neither on all ranks nothing.
	mixed := map[int]map[string]string{
		0: {"cpu_capacity": "1024", "cpufreq/cpuinfo_max_freq": "2000000"},
		1: {"cpufreq/cpuinfo_max_freq": "3000000"},
	}
	if cl, err = ClustersAt(fakeCPUs(t, "0-1", mixed)); err != nil || len(cl) != 2 || cl[0].CPUs.String() != "1" {
		t.Errorf("mixed sources: %v, %v; want CPU 1 first, by clock", cl, err)
	}
	unranked := map[int]map[string]string{0: {"cpu_capacity": "1024"}}
	if cl, err = ClustersAt(fakeCPUs(t, "0-1", unranked)); err != nil || len(cl) != 1 || cl[0].Capacity != 0 || cl[0].CPUs.String() != "0-1" {
		t.Errorf("a capacity on one CPU of two: %v, %v; want one cluster of capacity 0", cl, err)
	}

	if _, err := ClustersAt(t.TempDir()); err == nil {
		t.Error("a directory without online: no error")
	}
	if _, err := ClustersAt(fakeCPUs(t, "x", nil)); err == nil {
		t.Error("a malformed online list: no error")
	}
}

func TestPin(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "android" {
		if err := Check(Set{0}); err == nil {
			t.Fatal("Check succeeded where pinning is not supported")
		}
		return
	}
	allowed, err := Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if len(allowed) == 0 {
		t.Fatal("no CPUs allowed")
	}
	last := Set{allowed[len(allowed)-1]}
	if err := Check(last); err != nil {
		t.Fatalf("Check(%v): %v", last, err)
	}
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the pinned thread exits with the goroutine
		if err := Pin(last); err != nil {
			done <- err
			return
		}
		runtime.Gosched()
		got, err := Current()
		if err == nil && !slices.Equal(got, last) {
			err = &mismatch{got, last}
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Pinning another thread left this one alone.
	if now, err := Allowed(); err != nil || !slices.Equal(now, allowed) {
		t.Errorf("the process's CPUs changed: %v, %v; were %v", now, err, allowed)
	}
	// A CPU past the allowed ones (machines have far fewer than MaxCPU).
	outside := Set{allowed[len(allowed)-1] + 1}
	if err := Check(outside); err == nil || !strings.Contains(err.Error(), "may use only") {
		t.Errorf("Check(%v) = %v, want an error naming the CPUs available", outside, err)
	}
}

type mismatch struct{ got, want Set }

func (m *mismatch) Error() string {
	return "pinned thread runs on " + m.got.String() + ", want " + m.want.String()
}
