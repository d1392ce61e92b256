package jetson

import (
	"path"
	"regexp"
	"strings"
)

// GPU is the Jetson integrated GPU (nvgpu driver).
type GPU struct {
	// Name is the GPU's device-tree node name: ga10b (Orin), gv11b
	// (Xavier), gp10b (TX2), gm20b (TX1), or "gpu" (Nano; Orin on L4T R36).
	Name string `json:"name,omitempty"`
	// Device is the sysfs directory holding the load file, e.g.
	// /sys/devices/platform/17000000.ga10b.
	Device string `json:"device"`
	// LoadPercent is the GPU busy time over the driver's last sample
	// window (nvgpu reports it in per-mille).
	LoadPercent *float64 `json:"load_percent,omitempty"`
	// CurFreqHz, MinFreqHz and MaxFreqHz come from the GPU's devfreq node;
	// MaxFreqHz reflects the power mode's cap.
	CurFreqHz *uint64 `json:"cur_freq_hz,omitempty"`
	MinFreqHz *uint64 `json:"min_freq_hz,omitempty"`
	MaxFreqHz *uint64 `json:"max_freq_hz,omitempty"`
	Governor  string  `json:"governor,omitempty"`
}

// gpuNodeNames are the device-tree names of Jetson integrated GPUs. "gpu"
// is generic (Nano's node is "gpu"), which is why the GPU is only looked
// for on boards already known to be Jetsons.
var gpuNodeNames = map[string]bool{"ga10b": true, "gv11b": true, "gp10b": true, "gm20b": true, "gpu": true}

// gpuDevices are the nvgpu device directories across L4T releases, tried
// when no devfreq node names the GPU (devfreq off, or a tree captured
// without /sys/class). gpu.0 is the stable alias some releases add.
var gpuDevices = []string{
	"/sys/devices/gpu.0",
	"/sys/devices/platform/gpu.0",
	"/sys/devices/platform/bus@0/17000000.gpu", // Orin, L4T R36
	"/sys/devices/platform/17000000.ga10b",     // Orin, L4T R34/R35
	"/sys/devices/17000000.ga10b",
	"/sys/devices/platform/17000000.gv11b",
	"/sys/devices/17000000.gv11b", // Xavier
	"/sys/devices/17000000.gp10b", // TX2
	"/sys/devices/57000000.gpu",   // Nano, TX1
}

var anyEntry = regexp.MustCompile(`.`)

func (p *prober) gpu() *GPU {
	// devfreq names the GPU by its device-tree node and links to the
	// device, which holds the load file; this finds it on any release.
	const class = "/sys/class/devfreq"
	var clocksOnly *GPU // a devfreq GPU without a readable load file
	for _, e := range p.entries(class, anyEntry) {
		dir := class + "/" + e
		name, ok := p.readString(dir + "/device/of_node/name")
		if !ok || !gpuNodeNames[name] {
			continue
		}
		g := &GPU{Name: name, Device: p.resolve(dir + "/device")}
		p.gpuLoad(g)
		p.devfreq(g, dir)
		if g.LoadPercent != nil {
			return g
		}
		if clocksOnly == nil {
			clocksOnly = g
		}
	}
	for _, dev := range gpuDevices {
		if !p.exists(dev + "/load") {
			continue
		}
		g := &GPU{Device: dev}
		if name, ok := p.readString(dev + "/of_node/name"); ok {
			g.Name = name
		} else if i := strings.LastIndexByte(dev, '.'); i >= 0 && dev[i+1:] != "0" && dev[i+1:] != "gpu" {
			g.Name = dev[i+1:] // "17000000.ga10b" names the chip
		}
		p.gpuLoad(g)
		// The device's own devfreq subdirectory carries the clocks.
		if fs := p.entries(dev+"/devfreq", anyEntry); len(fs) > 0 {
			p.devfreq(g, dev+"/devfreq/"+fs[0])
		}
		return g
	}
	return clocksOnly
}

func (p *prober) gpuLoad(g *GPU) {
	file := path.Join(g.Device, "load")
	n, ok := p.readInt(file)
	if !ok {
		return
	}
	if n < 0 || n > 1000 {
		p.warnf(file, "load %d outside 0..1000 per-mille", n)
		return
	}
	pct := float64(n) / 10
	g.LoadPercent = &pct
}

func (p *prober) devfreq(g *GPU, dir string) {
	g.CurFreqHz, _ = p.readUint(dir + "/cur_freq")
	g.MinFreqHz, _ = p.readUint(dir + "/min_freq")
	g.MaxFreqHz, _ = p.readUint(dir + "/max_freq")
	g.Governor, _ = p.readString(dir + "/governor")
}
