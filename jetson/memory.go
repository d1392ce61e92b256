package jetson

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/shirou/gopsutil/v3/mem"
)

// Memory is system RAM. On Jetson the GPU has no memory of its own: CUDA
// allocations come out of this same RAM, so Available is what a model's
// weights, KV cache and activations share with everything else.
type Memory struct {
	// Source says where the numbers came from: "/proc/meminfo" or "gopsutil".
	Source string `json:"source,omitempty"`
	// UnifiedGPU is true on Jetson (the GPU allocates from this RAM) and
	// nil where that is not known.
	UnifiedGPU     *bool   `json:"unified_gpu,omitempty"`
	TotalBytes     *uint64 `json:"total_bytes,omitempty"`
	AvailableBytes *uint64 `json:"available_bytes,omitempty"`
	FreeBytes      *uint64 `json:"free_bytes,omitempty"`
	SwapTotalBytes *uint64 `json:"swap_total_bytes,omitempty"`
	SwapFreeBytes  *uint64 `json:"swap_free_bytes,omitempty"`
	// CMA is the contiguous memory area some Jetson drivers (camera,
	// display, older nvmap) allocate from; absent on many kernels.
	CMATotalBytes *uint64 `json:"cma_total_bytes,omitempty"`
	CMAFreeBytes  *uint64 `json:"cma_free_bytes,omitempty"`
}

func (p *prober) memory(jetson bool) Memory {
	var m Memory
	if jetson {
		t := true
		m.UnifiedGPU = &t
	}
	const file = "/proc/meminfo"
	raw, ok := p.read(file)
	if ok {
		fields, err := ParseMeminfo(raw)
		if err != nil {
			p.warnf(file, "%v", err)
		}
		// Keep what parsed even when some lines did not.
		if len(fields) > 0 {
			m.Source = file
			get := func(k string) *uint64 {
				if v, ok := fields[k]; ok {
					return &v
				}
				return nil
			}
			m.TotalBytes, m.AvailableBytes, m.FreeBytes = get("MemTotal"), get("MemAvailable"), get("MemFree")
			m.SwapTotalBytes, m.SwapFreeBytes = get("SwapTotal"), get("SwapFree")
			m.CMATotalBytes, m.CMAFreeBytes = get("CmaTotal"), get("CmaFree")
		}
	}
	if m.TotalBytes == nil && p.live {
		// No usable /proc/meminfo on the live system (macOS, Windows, a
		// locked-down Android): ask the OS through gopsutil.
		if err := fromGopsutil(&m); err != nil {
			p.warnf(file, "absent or unusable, and gopsutil failed: %v", err)
		}
	}
	return m
}

// fromGopsutil fills the totals from the OS.
func fromGopsutil(m *Memory) error {
	vm, err := mem.VirtualMemory()
	if err != nil {
		return fmt.Errorf("virtual memory: %w", err)
	}
	m.Source = "gopsutil"
	total, avail, free := vm.Total, vm.Available, vm.Free
	m.TotalBytes, m.AvailableBytes, m.FreeBytes = &total, &avail, &free
	sw, err := mem.SwapMemory()
	if err != nil {
		return fmt.Errorf("swap: %w", err)
	}
	st, sf := sw.Total, sw.Free
	m.SwapTotalBytes, m.SwapFreeBytes = &st, &sf
	return nil
}

// ParseMeminfo parses /proc/meminfo ("MemTotal:  32559588 kB" per line)
// into bytes by field name; fields without a unit (HugePages_Total) are
// plain counts. Malformed lines are skipped and named in the returned
// error, alongside the fields that did parse.
func ParseMeminfo(b []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	var bad []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		key, rest, ok := strings.Cut(line, ":")
		key = strings.TrimSpace(key)
		f := strings.Fields(rest)
		if !ok || key == "" || len(f) == 0 || len(f) > 2 {
			bad = append(bad, fmt.Sprintf("line %d: want \"Name: value [kB]\", got %q", i+1, clip(line)))
			continue
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			bad = append(bad, fmt.Sprintf("line %d: %s: bad value %q", i+1, key, clip(f[0])))
			continue
		}
		if len(f) == 2 {
			if f[1] != "kB" {
				bad = append(bad, fmt.Sprintf("line %d: %s: unknown unit %q", i+1, key, clip(f[1])))
				continue
			}
			if v > math.MaxUint64/1024 {
				bad = append(bad, fmt.Sprintf("line %d: %s: %d kB overflows", i+1, key, v))
				continue
			}
			v *= 1024
		}
		out[key] = v
	}
	return out, lineErrors(bad)
}

// lineErrors folds per-line problems into one single-line error, naming
// the first few so that a garbage file gives a short warning.
func lineErrors(bad []string) error {
	switch {
	case len(bad) == 0:
		return nil
	case len(bad) > 3:
		return fmt.Errorf("%s; and %d more bad lines", strings.Join(bad[:3], "; "), len(bad)-3)
	}
	return errors.New(strings.Join(bad, "; "))
}
