package kernels

import (
	"fmt"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
)

// TestDefaultThreads: on cores that differ, a pool's default threads are
// the fastest clusters' that compute the most counted at the slowest of
// them's speed (an even split waits for its slowest thread); on alike
// cores, the physical ones.
func TestDefaultThreads(t *testing.T) {
	type cpu struct {
		capacity int
		core     int // core_id, or -1 for no topology files
	}
	tree := func(cpus []cpu) string {
		files := map[string]string{"online": fmt.Sprintf("0-%d", len(cpus)-1)}
		for i, c := range cpus {
			files[fmt.Sprintf("cpu%d/cpu_capacity", i)] = fmt.Sprint(c.capacity)
			if c.core >= 0 {
				files[fmt.Sprintf("cpu%d/topology/core_id", i)] = fmt.Sprint(c.core)
				files[fmt.Sprintf("cpu%d/topology/physical_package_id", i)] = "0"
			}
		}
		return testutil.WriteTree(t, files)
	}
	phone := func(little int) []cpu { // 4 little, 3 big, 1 prime
		return []cpu{{little, -1}, {little, -1}, {little, -1}, {little, -1}, {870, -1}, {870, -1}, {870, -1}, {1024, -1}}
	}
	var hybrid []cpu // 4 performance cores with two threads each, 8 efficient ones
	for i := range 8 {
		hybrid = append(hybrid, cpu{1024, i / 2})
	}
	for i := range 8 {
		hybrid = append(hybrid, cpu{600, 8 + i})
	}
	all := func(n int) cpuset.Set {
		s := make(cpuset.Set, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		cpus    []cpu
		allowed cpuset.Set
		want    int
	}{
		{"phone: the big cores", phone(325), all(8), 4},         // 4 × 870 beats 8 × 325 and 1 × 1024
		{"phone with fast little cores", phone(600), all(8), 8}, // 8 × 600 beats 4 × 870
		{"phone limited to its little cores", phone(325), cpuset.Set{0, 1, 2, 3}, 4},
		{"hybrid x86: physical cores of both kinds", hybrid, all(16), 12}, // 12 × 600 beats 4 × 1024
		{"alike cores: the physical count", []cpu{{1024, 0}, {1024, 0}}, all(2), 7},
	} {
		if got := defaultThreadsAt(tree(tc.cpus), tc.allowed, 7); got != tc.want {
			t.Errorf("%s: %d threads, want %d", tc.name, got, tc.want)
		}
	}
	if got := defaultThreadsAt(t.TempDir(), all(2), 3); got != 3 {
		t.Errorf("no sysfs: %d threads, want the physical count 3", got)
	}
	if n := DefaultThreads(); n < 1 || n > PhysicalCores() {
		t.Errorf("this machine: %d default threads of %d physical cores", n, PhysicalCores())
	}
}
