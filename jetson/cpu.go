package jetson

import (
	"regexp"
	"slices"
	"strconv"

	"github.com/tandem-llm/tandem/kernels/cpuset"
)

// CPU is which cores are online and their clocks. nvpmodel modes switch
// cores off and cap their clocks, so both matter for CPU-side decode.
type CPU struct {
	// Online is /sys/devices/system/cpu/online as written, e.g. "0-5".
	Online      string `json:"online,omitempty"`
	OnlineCount *int   `json:"online_count,omitempty"`
	Cores       []Core `json:"cores,omitempty"`
	// Clusters group the online cores by capacity, fastest first (one
	// for alike cores): what tandem's --lanes names big and little.
	Clusters cpuset.Topology `json:"clusters,omitempty"`
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
		ids, err := cpuset.Parse(s)
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
	if c.OnlineCount != nil {
		// The online list parsed; anything else missing counts as alike.
		if t, err := cpuset.ClustersAt(p.path(sys)); err == nil {
			c.Clusters = t
		}
	}
	return c
}
