package jetson

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// CPU is which cores are online and their clocks. nvpmodel modes switch
// cores off and cap their clocks, so both matter for CPU-side decode.
type CPU struct {
	// Online is /sys/devices/system/cpu/online as written, e.g. "0-5".
	Online      string `json:"online,omitempty"`
	OnlineCount *int   `json:"online_count,omitempty"`
	Cores       []Core `json:"cores,omitempty"`
}

// Core is one logical CPU.
type Core struct {
	ID int `json:"id"`
	// Online is nil when the online list is unknown.
	Online *bool `json:"online,omitempty"`
	// CurKHz, MaxKHz and Governor are cpufreq's scaling_cur_freq,
	// scaling_max_freq and scaling_governor; absent for offline cores.
	CurKHz   *uint64 `json:"cur_khz,omitempty"`
	MaxKHz   *uint64 `json:"max_khz,omitempty"`
	Governor string  `json:"governor,omitempty"`
}

var cpuDir = regexp.MustCompile(`^cpu[0-9]+$`)

func (p *prober) cpu() CPU {
	const sys = "/sys/devices/system/cpu"
	var c CPU
	var online []int
	if s, ok := p.readString(sys + "/online"); ok {
		ids, err := ParseCPUList(s)
		if err != nil {
			p.warnf(sys+"/online", "%v", err)
		} else {
			c.Online, online = s, ids
			n := len(ids)
			c.OnlineCount = &n
		}
	}
	for _, e := range p.entries(sys, cpuDir) {
		id, _ := strconv.Atoi(e[3:])
		core := Core{ID: id}
		if c.OnlineCount != nil {
			on := slices.Contains(online, id)
			core.Online = &on
		}
		dir := sys + "/" + e + "/cpufreq"
		core.CurKHz, _ = p.readUint(dir + "/scaling_cur_freq")
		core.MaxKHz, _ = p.readUint(dir + "/scaling_max_freq")
		core.Governor, _ = p.readString(dir + "/scaling_governor")
		c.Cores = append(c.Cores, core)
	}
	return c
}

// maxCPUID bounds CPU lists: the kernel's NR_CPUS limit is 8192, and a
// bound keeps "0-4000000000" from allocating.
const maxCPUID = 8191

// ParseCPUList parses a kernel CPU list such as "0-3,6,8-11" into sorted,
// distinct ids.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty CPU list")
	}
	// A bitmap, not appends: "0-8191,0-8191,..." must stay small.
	var seen [maxCPUID + 1]bool
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a > maxCPUID {
			return nil, fmt.Errorf("bad CPU id %q in %q", clip(lo), clip(s))
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b > maxCPUID {
				return nil, fmt.Errorf("bad CPU range %q in %q", clip(part), clip(s))
			}
		}
		for i := a; i <= b; i++ {
			seen[i] = true
		}
	}
	var ids []int
	for i, on := range seen {
		if on {
			ids = append(ids, i)
		}
	}
	return ids, nil
}
