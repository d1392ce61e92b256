// Package cpuset names sets of CPUs and pins threads to them: the CPU
// lists Linux writes ("0-3,6"), the clusters of a phone's big and little
// cores read from sysfs, and thread affinity. A CPU lane pinned to a
// cluster computes there, where a lane that floats is placed by the
// kernel, which moves a busy thread to the big cores whichever lane it
// serves.
package cpuset

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// MaxCPU is the highest CPU number a list may name: the kernel's
// NR_CPUS limit is 8192. Pinning takes CPUs up to MaxPinned.
const MaxCPU = 8191

// MaxPinned is the highest CPU a thread can be pinned to here: the
// affinity masks are 1024 bits, as glibc's and Go's are.
const MaxPinned = 1023

// Set is a set of CPU numbers, ascending and without repeats.
type Set []int

// Parse reads a CPU list as Linux writes it: comma-separated numbers and
// ranges, "0-3,6".
func Parse(s string) (Set, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("cpuset: empty CPU list; want numbers and ranges such as 0-3,6")
	}
	// A bitmap, not appends: "0-8191,0-8191,..." must stay small.
	var seen [MaxCPU + 1]bool
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("cpuset: CPU list %q: %w", clip(s), err)
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return nil, fmt.Errorf("cpuset: CPU list %q: %w", clip(s), err)
			}
			if b < a {
				return nil, fmt.Errorf("cpuset: CPU list %q: range %s runs backwards", clip(s), clip(part))
			}
		}
		for c := a; c <= b; c++ {
			seen[c] = true
		}
	}
	var out Set
	for c, on := range seen {
		if on {
			out = append(out, c)
		}
	}
	return out, nil
}

func cpuNumber(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a CPU number", clip(s))
	}
	if n > MaxCPU {
		return 0, fmt.Errorf("CPU %d is past the kernel's last (%d)", n, MaxCPU)
	}
	return n, nil
}

// clip shortens what an error quotes.
func clip(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// String writes s as a CPU list, runs as ranges: "0-3,6".
func (s Set) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// MarshalText writes s as a CPU list, so JSON shows "4-7".
func (s Set) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a CPU list; an empty one is the empty set.
func (s *Set) UnmarshalText(b []byte) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		*s = nil
		return nil
	}
	t, err := Parse(string(b))
	*s = t
	return err
}

// Union is every CPU of the sets, ascending and without repeats.
func Union(sets ...Set) Set {
	var u Set
	for _, s := range sets {
		u = append(u, s...)
	}
	slices.Sort(u)
	return slices.Compact(u)
}

// Has reports whether cpu is in s.
func (s Set) Has(cpu int) bool {
	_, ok := slices.BinarySearch(s, cpu)
	return ok
}

// Contains reports whether every CPU of sub is in s.
func (s Set) Contains(sub Set) bool {
	for _, c := range sub {
		if !s.Has(c) {
			return false
		}
	}
	return true
}

// Where says where a pinned lane computes, for the lines that describe
// it: " on CPUs 4-7", or "" for nil (placed by the OS).
func (s Set) Where() string {
	if s == nil {
		return ""
	}
	return " on CPUs " + s.String()
}

// Cluster is a group of CPUs of one capacity: a phone's big or little
// cores.
type Cluster struct {
	CPUs Set `json:"cpus"`
	// Capacity is what the kernel says the cluster's slowest CPU
	// computes (cpu_capacity, 1024 for the fastest), or its highest clock
	// in kHz where the kernel gives no capacity; 0 when neither is known.
	Capacity int `json:"capacity"`
}

// SysCPU is where Linux describes the CPUs.
const SysCPU = "/sys/devices/system/cpu"

// Clusters groups this machine's online CPUs by capacity, fastest first.
// A machine whose CPUs are alike has one cluster.
func Clusters() (Topology, error) { return ClustersAt(SysCPU) }

// ClustersAt is Clusters reading the sysfs CPU directory dir (a captured
// tree's, for tandem info --root).
func ClustersAt(dir string) (Topology, error) {
	raw, err := readSmall(filepath.Join(dir, "online"))
	if err != nil {
		return nil, fmt.Errorf("cpuset: which CPUs are online: %w", err)
	}
	online, err := Parse(string(raw))
	if err != nil {
		return nil, fmt.Errorf("cpuset: %s: %w", filepath.Join(dir, "online"), err)
	}
	// The capacity is what the kernel's scheduler weighs cores by; the
	// highest clock ranks them where it is missing (older kernels),
	// though a little core at a big one's clock computes less. One source
	// for every CPU: the two are not comparable.
	var caps []int
	for _, source := range []string{"cpu_capacity", "cpufreq/cpuinfo_max_freq"} {
		caps = caps[:0]
		for _, c := range online {
			b, err := readSmall(filepath.Join(dir, "cpu"+strconv.Itoa(c), source))
			v, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || perr != nil || v <= 0 {
				break
			}
			caps = append(caps, v)
		}
		if len(caps) == len(online) {
			break
		}
	}
	if len(caps) != len(online) {
		return Topology{{CPUs: online}}, nil // nothing ranks them: alike
	}
	order := make([]int, len(online)) // indexes into online, fastest first
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return caps[b] - caps[a] })
	var out Topology
	var tops []int // each cluster's fastest CPU's capacity
	for _, i := range order {
		// Within 5% of a cluster's fastest core is the same cluster: some
		// kernels give alike cores capacities a few units apart.
		if n := len(out); n > 0 && caps[i]*100 >= tops[n-1]*95 {
			out[n-1].CPUs = append(out[n-1].CPUs, online[i])
			out[n-1].Capacity = caps[i]
			continue
		}
		out = append(out, Cluster{CPUs: Set{online[i]}, Capacity: caps[i]})
		tops = append(tops, caps[i])
	}
	for i := range out {
		slices.Sort(out[i].CPUs)
	}
	return out, nil
}

// readSmall reads a sysfs file of a few bytes, and at most 4 KiB of
// anything else a captured tree holds in its place.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<10))
}

// Named resolves a lane's CPUs on this machine: "big" (every core but
// the slowest cluster's), "little" (the slowest cluster), or a CPU list.
func Named(name string) (Set, error) {
	switch strings.TrimSpace(name) {
	case "big", "little":
		cl, err := Clusters()
		if err != nil {
			return nil, err
		}
		return cl.Named(name)
	}
	return Parse(name)
}

// Topology is a machine's clusters, fastest first (Clusters).
type Topology []Cluster

// Named resolves a lane's CPUs on t: "big" (every core but the slowest
// cluster's, so a phone's prime core counts as big), "little" (the
// slowest cluster), or a CPU list.
func (t Topology) Named(name string) (Set, error) {
	name = strings.TrimSpace(name)
	if name != "big" && name != "little" {
		return Parse(name)
	}
	if len(t) < 2 {
		return nil, fmt.Errorf("cpuset: %q: this machine's CPUs (%s) are alike, with no big and little cores; name CPUs instead, such as 0-1", name, clusterCPUs(t))
	}
	if name == "little" {
		return t[len(t)-1].CPUs, nil
	}
	return clusterCPUs(t[:len(t)-1]), nil
}

// clusterCPUs is the union of the clusters' CPUs.
func clusterCPUs(clusters []Cluster) Set {
	var sets []Set
	for _, c := range clusters {
		sets = append(sets, c.CPUs)
	}
	return Union(sets...)
}

// Run calls fn on a thread pinned to s and waits for it. The thread
// exits after fn instead of going back to run other goroutines pinned.
// A set the process may not use is refused as Check says.
func Run(s Set, fn func() error) error {
	if err := Check(s); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := Pin(s); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}
