package jetson

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// want is what a fixture tree must probe to; zero fields are not checked
// unless noted.
type want struct {
	jetson                bool
	model, soc, family    string
	chipID                int // -1: must be unknown
	l4t, jetpack, variant string
	kernel                string
	totalBytes, cmaTotal  uint64 // cmaTotal 0: must be unknown
	swapFree              uint64
	power                 string // "id name source", "" = must be unknown
	modes                 int
	gpu                   string // "name device", "" = must be unknown
	gpuLoad               float64
	gpuCurHz              uint64
	online                int
	cores                 int
	zones, offline        int
	cooling               int
	throttling            string // "yes", "no", "" = unknown
	reasons               []string
}

func TestProbeFixtures(t *testing.T) {
	for _, tc := range []struct {
		name string
		want want
	}{
		{"orin-agx-jp5", want{
			jetson: true, model: "Jetson AGX Orin Developer Kit", soc: "tegra234", family: "Orin", chipID: 0x23,
			l4t: "35.4.1", jetpack: "5.1.2", kernel: "5.10.120-tegra",
			totalBytes: 63870764 * 1024, cmaTotal: 524288 * 1024, swapFree: 31935376 * 1024,
			power: "0 MAXN /var/lib/nvpmodel/status", modes: 4,
			gpu: "ga10b /sys/devices/platform/17000000.ga10b", gpuLoad: 12.1, gpuCurHz: 624750000,
			online: 12, cores: 12, zones: 11, offline: 3, cooling: 1, throttling: "no",
		}},
		{"orin-nano-jp6", want{
			jetson: true, model: "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
			soc: "tegra234", family: "Orin", chipID: -1,
			l4t: "36.4.3", jetpack: "6.2", variant: "oot", kernel: "5.15.148-tegra",
			totalBytes: 7802060 * 1024, swapFree: 3901024 * 1024,
			power: "2 MAXN_SUPER /etc/nvpmodel.conf default", modes: 4,
			gpu: "gpu /sys/class/devfreq/17000000.gpu/device", gpuLoad: 0, gpuCurHz: 306000000,
			online: 6, cores: 6, zones: 9, offline: 3, cooling: 1, throttling: "no",
		}},
		{"xavier-nx-jp5", want{
			jetson: true, model: "NVIDIA Jetson Xavier NX Developer Kit", soc: "tegra194", family: "Xavier", chipID: 0x19,
			l4t: "35.5.0", jetpack: "5.1.3", kernel: "5.10.192-tegra",
			totalBytes: 7599500 * 1024, cmaTotal: 262144 * 1024, swapFree: 1212416 * 1024,
			power: "4 MODE_10W_4CORE /var/lib/nvpmodel/status", modes: 9,
			gpu: "gv11b /sys/devices/gpu.0", gpuLoad: 99.7, gpuCurHz: 803250000,
			online: 4, cores: 6, zones: 6, cooling: 3, throttling: "yes",
			reasons: []string{"thermal_zone2 (GPU-therm) at 97.5 °C, passive trip 96.0 °C", "cooling_device1 (gpu-balanced) at state 2/4"},
		}},
		{"x86-linux", want{
			chipID: -1, kernel: "6.8.0-45-generic",
			totalBytes: 32559588 * 1024, swapFree: 2097148 * 1024,
			online: 8, cores: 8, zones: 4, cooling: 11, throttling: "no",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := Probe(filepath.Join("testdata", tc.name))
			if err != nil {
				t.Fatal(err)
			}
			checkInfo(t, info, tc.want)
			if len(info.Warnings) > 0 {
				t.Errorf("warnings on a well-formed tree: %q", info.Warnings)
			}
			// The JSON form is the CLI's contract; it must round-trip.
			b, err := json.Marshal(info)
			if err != nil {
				t.Fatal(err)
			}
			var back Info
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			b2, _ := json.Marshal(back)
			if string(b) != string(b2) {
				t.Errorf("JSON does not round-trip:\n%s\n%s", b, b2)
			}
		})
	}
}

func checkInfo(t *testing.T, info Info, w want) {
	t.Helper()
	b := info.Board
	if info.Jetson != w.jetson || b.Model != w.model || b.SoC != w.soc || b.Family != w.family {
		t.Errorf("jetson %v model %q soc %q family %q, want %v %q %q %q", info.Jetson, b.Model, b.SoC, b.Family, w.jetson, w.model, w.soc, w.family)
	}
	switch {
	case w.chipID < 0 && b.ChipID != nil:
		t.Errorf("chip id %d, want unknown", *b.ChipID)
	case w.chipID >= 0 && (b.ChipID == nil || *b.ChipID != w.chipID):
		t.Errorf("chip id %v, want %d", b.ChipID, w.chipID)
	}
	if w.l4t == "" {
		if b.L4T != nil || b.JetPack != "" {
			t.Errorf("L4T %+v JetPack %q, want unknown", b.L4T, b.JetPack)
		}
	} else if b.L4T == nil || b.L4T.Version != w.l4t || b.JetPack != w.jetpack || b.L4T.KernelVariant != w.variant {
		t.Errorf("L4T %+v JetPack %q, want %s %s %q", b.L4T, b.JetPack, w.l4t, w.jetpack, w.variant)
	}
	if info.Kernel != w.kernel {
		t.Errorf("kernel %q, want %q", info.Kernel, w.kernel)
	}

	m := info.Memory
	if m.TotalBytes == nil || *m.TotalBytes != w.totalBytes || m.AvailableBytes == nil || m.SwapFreeBytes == nil || *m.SwapFreeBytes != w.swapFree {
		t.Errorf("memory %+v, want total %d swap free %d", m, w.totalBytes, w.swapFree)
	}
	if w.cmaTotal == 0 && m.CMATotalBytes != nil || w.cmaTotal != 0 && (m.CMATotalBytes == nil || *m.CMATotalBytes != w.cmaTotal) {
		t.Errorf("CMA total %v, want %d (0 = unknown)", m.CMATotalBytes, w.cmaTotal)
	}
	if (m.UnifiedGPU != nil) != w.jetson {
		t.Errorf("unified GPU memory %v on jetson=%v", m.UnifiedGPU, w.jetson)
	}

	if w.power == "" {
		if info.Power != nil {
			t.Errorf("power mode %+v, want unknown", info.Power)
		}
	} else if info.Power == nil {
		t.Errorf("power mode unknown, want %s", w.power)
	} else if got := strings.Join([]string{itoa(info.Power.ID), info.Power.Name, info.Power.Source}, " "); got != w.power || len(info.Power.Modes) != w.modes {
		t.Errorf("power mode %q with %d modes, want %q with %d", got, len(info.Power.Modes), w.power, w.modes)
	}

	if w.gpu == "" {
		if info.GPU != nil {
			t.Errorf("GPU %+v, want unknown", info.GPU)
		}
	} else if g := info.GPU; g == nil {
		t.Errorf("GPU unknown, want %s", w.gpu)
	} else if g.Name+" "+g.Device != w.gpu || g.LoadPercent == nil || *g.LoadPercent != w.gpuLoad || g.CurFreqHz == nil || *g.CurFreqHz != w.gpuCurHz || g.Governor == "" {
		t.Errorf("GPU %+v, want %s load %.1f cur %d", g, w.gpu, w.gpuLoad, w.gpuCurHz)
	}

	c := info.CPU
	if c.OnlineCount == nil || *c.OnlineCount != w.online || len(c.Cores) != w.cores {
		t.Errorf("CPU %v online of %d cores, want %d of %d", c.OnlineCount, len(c.Cores), w.online, w.cores)
	}
	for _, k := range c.Cores {
		if k.Online == nil || *k.Online != (k.CurKHz != nil) {
			t.Errorf("core %d: online %v but cur freq %v", k.ID, k.Online, k.CurKHz)
		}
	}
	for i := 1; i < len(c.Cores); i++ {
		if c.Cores[i].ID <= c.Cores[i-1].ID {
			t.Errorf("cores out of order: %d after %d", c.Cores[i].ID, c.Cores[i-1].ID)
		}
	}

	th := info.Thermal
	offline := 0
	for i, z := range th.Zones {
		if z.Name != "thermal_zone"+itoa(i) {
			t.Errorf("zone %d is %s; want natural order", i, z.Name)
		}
		if z.Offline {
			offline++
		}
	}
	if len(th.Zones) != w.zones || offline != w.offline || len(th.Cooling) != w.cooling {
		t.Errorf("%d zones (%d offline), %d cooling devices; want %d (%d), %d", len(th.Zones), offline, len(th.Cooling), w.zones, w.offline, w.cooling)
	}
	got := ""
	if th.Throttling != nil {
		got = map[bool]string{true: "yes", false: "no"}[*th.Throttling]
	}
	if got != w.throttling || strings.Join(th.Reasons, "|") != strings.Join(w.reasons, "|") {
		t.Errorf("throttling %q %q, want %q %q", got, th.Reasons, w.throttling, w.reasons)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestProbeMalformed checks that every broken file becomes one warning
// naming it, that nothing is invented from it, and that the good lines
// around a bad one still count.
func TestProbeMalformed(t *testing.T) {
	info, err := Probe(filepath.Join("testdata", "malformed"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"/sys/module/tegra_fuse/parameters/tegra_chip_id: want a chip id",
		"/etc/nv_tegra_release: first line",
		`/proc/meminfo: line 2: want "Name: value [kB]"`,
		`line 3: MemAvailable: bad value "lots"`,
		`line 4: SwapTotal: unknown unit "MB"`,
		"/etc/nvpmodel.conf: line 1:",
		"line 3: unterminated tag",
		`/var/lib/nvpmodel/status: bad mode id "MAXN"`,
		"/sys/devices/gpu.0/load: load 2000 outside 0..1000",
		`/sys/devices/system/cpu/online: cpuset: CPU list "0-x": "x" is not a CPU number`,
		"/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq: want an integer",
		`/sys/class/thermal/thermal_zone0/temp: want millidegrees C, got "hot"`,
		"/sys/class/thermal/cooling_device0/max_state: want an integer",
	} {
		if !strings.Contains(strings.Join(info.Warnings, "\n"), w) {
			t.Errorf("no warning containing %q in:\n%s", w, strings.Join(info.Warnings, "\n"))
		}
	}
	if len(info.Warnings) != 10 {
		t.Errorf("%d warnings, want one per bad file (10):\n%s", len(info.Warnings), strings.Join(info.Warnings, "\n"))
	}
	if !info.Jetson || info.Board.SoC != "tegra234" || info.Board.ChipID != nil || info.Board.L4T != nil {
		t.Errorf("board %+v", info.Board)
	}
	if m := info.Memory; m.TotalBytes == nil || *m.TotalBytes != 7802060*1024 || m.AvailableBytes != nil || m.SwapTotalBytes != nil {
		t.Errorf("memory %+v: want MemTotal kept, the bad lines unknown", m)
	}
	if info.Power != nil {
		t.Errorf("power mode %+v from a bad status file", info.Power)
	}
	if g := info.GPU; g == nil || g.LoadPercent != nil {
		t.Errorf("GPU %+v: want the device found, load unknown", g)
	}
	if z := info.Thermal.Zones; len(z) != 1 || z[0].TempC != nil || z[0].Offline {
		t.Errorf("zones %+v: want one zone, temperature unknown (not offline)", z)
	}
}

func TestProbeRoot(t *testing.T) {
	if _, err := Probe(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing root: %v, want ErrNotExist", err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Probe(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file as root: %v", err)
	}
	// An empty tree is a machine we know nothing about: no error, no
	// warnings, everything unknown.
	info, err := Probe(t.TempDir())
	if err != nil || info.Jetson || len(info.Warnings) > 0 || info.Memory.TotalBytes != nil || info.Power != nil ||
		info.GPU != nil || info.CPU.OnlineCount != nil || info.Thermal.Throttling != nil {
		t.Errorf("empty tree: %+v, %v", info, err)
	}
}

// TestLocal probes this machine. CI and development machines are not
// Jetsons; on a Jetson the test checks the opposite.
func TestLocal(t *testing.T) {
	info, err := Local()
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat("/etc/nv_tegra_release")
	onJetson := statErr == nil
	if info.Jetson != onJetson {
		t.Errorf("Jetson = %v, but /etc/nv_tegra_release present = %v", info.Jetson, onJetson)
	}
	if !onJetson && (info.GPU != nil || info.Memory.UnifiedGPU != nil || info.Board.L4T != nil) {
		t.Errorf("Jetson-only fields set off-Jetson: GPU %+v unified %v L4T %+v", info.GPU, info.Memory.UnifiedGPU, info.Board.L4T)
	}
	if info.Memory.TotalBytes == nil || *info.Memory.TotalBytes == 0 {
		t.Errorf("no memory total from %q", info.Memory.Source)
	}
	if runtime.GOOS == "linux" && info.CPU.OnlineCount == nil {
		t.Errorf("no online CPUs on Linux")
	}
	t.Logf("this machine: jetson=%v memory %s warnings %q", info.Jetson, info.Memory.Source, info.Warnings)
}

// TestGopsutilAgrees checks the fallback used where /proc/meminfo is
// unusable against /proc/meminfo itself.
func TestGopsutilAgrees(t *testing.T) {
	var m Memory
	if err := fromGopsutil(&m); err != nil {
		t.Fatal(err)
	}
	if m.TotalBytes == nil || *m.TotalBytes == 0 || m.Source != "gopsutil" {
		t.Fatalf("gopsutil memory %+v", m)
	}
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Skipf("no /proc/meminfo to compare with: %v", err)
	}
	f, err := ParseMeminfo(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f["MemTotal"] != *m.TotalBytes {
		t.Errorf("gopsutil total %d, /proc/meminfo %d", *m.TotalBytes, f["MemTotal"])
	}
}

// TestNvpmodelQuery covers the live path, where "nvpmodel -q" answers
// before the saved status file is consulted.
func TestNvpmodelQuery(t *testing.T) {
	root := filepath.Join("testdata", "orin-nano-jp6")
	for _, tc := range []struct {
		name   string
		out    string
		err    error
		want   string // "id name source fan"
		warned bool
	}{
		{"answers", "NVPM WARN: power mode is not set!\nNV Fan Mode:quiet\nNV Power Mode: 25W\n1\n", nil, "1 25W nvpmodel -q quiet", false},
		{"fails", "", errors.New("exit status 255"), "2 MAXN_SUPER /etc/nvpmodel.conf default ", true},
		{"garbage", "Usage: nvpmodel\n", nil, "2 MAXN_SUPER /etc/nvpmodel.conf default ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProber(root, false)
			p.nvpmodel = func(ctx context.Context) ([]byte, error) {
				if _, ok := ctx.Deadline(); !ok {
					t.Error("nvpmodel run without a deadline")
				}
				return []byte(tc.out), tc.err
			}
			info, err := p.probe()
			if err != nil {
				t.Fatal(err)
			}
			pm := info.Power
			if pm == nil {
				t.Fatal("no power mode")
			}
			if got := strings.Join([]string{itoa(pm.ID), pm.Name, pm.Source, pm.FanMode}, " "); got != tc.want || len(pm.Modes) != 4 || pm.DefaultID == nil || *pm.DefaultID != 2 {
				t.Errorf("got %q modes %d default %v, want %q", got, len(pm.Modes), pm.DefaultID, tc.want)
			}
			warned := strings.Contains(strings.Join(info.Warnings, "\n"), "nvpmodel -q: ")
			if warned != tc.warned {
				t.Errorf("warnings %q, want an nvpmodel warning: %v", info.Warnings, tc.warned)
			}
		})
	}
}

func TestResolveSymlinks(t *testing.T) {
	root := t.TempDir()
	dev := filepath.Join(root, "sys", "devices", "platform", "bus@0", "17000000.gpu")
	link := filepath.Join(root, "sys", "class", "devfreq", "17000000.gpu")
	for _, d := range []string{dev, link} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../devices/platform/bus@0/17000000.gpu", filepath.Join(link, "device")); err != nil {
		t.Skipf("no symlinks here: %v", err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(link, "outside")); err != nil {
		t.Fatal(err)
	}
	p := newProber(root, false)
	if got := p.resolve("/sys/class/devfreq/17000000.gpu/device"); got != "/sys/devices/platform/bus@0/17000000.gpu" {
		t.Errorf("resolve = %q", got)
	}
	if got := p.resolve("/sys/class/devfreq/17000000.gpu/outside"); got != "/sys/class/devfreq/17000000.gpu/outside" {
		t.Errorf("a link leaving the root resolved to %q", got)
	}
}
