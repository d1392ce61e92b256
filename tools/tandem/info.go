package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/jetson"
	"github.com/tandem-llm/tandem/kernels/cpuset"
)

func runInfo(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("info", "[--json] [--root DIR]",
		"Prints the platform tandem runs on: Jetson board and L4T/JetPack release, unified\n"+
			"memory, nvpmodel power mode, GPU load and clocks, CPU clocks and core clusters\n"+
			"(a phone's big and little cores, which serve --lanes N@big,N@little), thermal\n"+
			"zones and whether anything is throttling. Off-Jetson, the Jetson fields show as\n"+
			"unknown.\n"+
			"Files that exist but cannot be parsed are listed under warnings.", stdout, stderr,
		"tandem info", "tandem info --json", "tandem info --root captured-orin/")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	root := fs.String("root", "/", "read the platform files under `DIR` instead of / (a captured tree)")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	info, err := jetson.Probe(*root)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	}
	return infoText(info, stdout)
}

const unknown = "unknown"

func infoText(in jetson.Info, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }

	if in.Root != "/" {
		row("root:", "%s", in.Root)
	}
	b := in.Board
	platform := "not a Jetson"
	if in.Jetson {
		var parts []string
		for _, s := range []string{b.Family, b.SoC} {
			if s != "" {
				parts = append(parts, s)
			}
		}
		if b.ChipID != nil {
			parts = append(parts, fmt.Sprintf("chip 0x%02x", *b.ChipID))
		}
		if b.CUDACapability != "" {
			parts = append(parts, "CUDA "+b.CUDACapability)
		}
		platform = "NVIDIA Jetson"
		if len(parts) > 0 {
			platform += " (" + strings.Join(parts, ", ") + ")"
		}
	}
	row("platform:", "%s", platform)
	row("board:", "%s", orUnknown(b.Model))
	if b.L4T != nil {
		jp := "JetPack " + orUnknown(b.JetPack)
		row("L4T:", "R%s (%s), BSP %s, built %s", b.L4T.Version, jp, orUnknown(b.L4T.Board), orUnknown(b.L4T.Date))
	} else if in.Jetson {
		row("L4T:", "%s", unknown)
	}
	row("kernel:", "%s", orUnknown(in.Kernel))

	m := in.Memory
	mem := fmt.Sprintf("%s total, %s available, %s free", bytesOr(m.TotalBytes), bytesOr(m.AvailableBytes), bytesOr(m.FreeBytes))
	if m.UnifiedGPU != nil && *m.UnifiedGPU {
		mem += "; shared with the GPU"
	}
	if m.Source != "" {
		mem += " (" + m.Source + ")"
	}
	row("memory:", "%s", mem)
	row("swap:", "%s total, %s free", bytesOr(m.SwapTotalBytes), bytesOr(m.SwapFreeBytes))
	if m.CMATotalBytes != nil {
		row("CMA:", "%s total, %s free", bytesOr(m.CMATotalBytes), bytesOr(m.CMAFreeBytes))
	}

	if p := in.Power; p != nil {
		s := fmt.Sprintf("%s (id %d, from %s)", orUnknown(p.Name), p.ID, p.Source)
		if p.FanMode != "" {
			s += ", fan " + p.FanMode
		}
		row("power mode:", "%s", s)
		if len(p.Modes) > 0 {
			ms := make([]string, len(p.Modes))
			for i, md := range p.Modes {
				ms[i] = fmt.Sprintf("%d=%s", md.ID, md.Name)
				if p.DefaultID != nil && md.ID == *p.DefaultID {
					ms[i] += " (default)"
				}
			}
			row("  modes:", "%s", strings.Join(ms, ", "))
		}
	} else {
		row("power mode:", "%s", unknown)
	}

	if g := in.GPU; g != nil {
		s := "load " + unknown
		if g.LoadPercent != nil {
			s = fmt.Sprintf("load %.1f%%", *g.LoadPercent)
		}
		if g.CurFreqHz != nil {
			s += ", " + mhz(*g.CurFreqHz/1000)
			if g.MaxFreqHz != nil {
				s += " (max " + mhz(*g.MaxFreqHz/1000) + ")"
			}
		}
		if g.Governor != "" {
			s += ", governor " + g.Governor
		}
		name := g.Name
		if name != "" {
			name += " "
		}
		row("GPU:", "%sat %s: %s", name, g.Device, s)
	} else {
		row("GPU:", "%s", unknown)
	}

	row("CPU:", "%s", cpuSummary(in.CPU))
	if cl := in.CPU.Clusters; len(cl) > 0 {
		row("  clusters:", "%s", clusterSummary(cl))
	}

	t := in.Thermal
	switch {
	case t.Throttling == nil:
		row("throttling:", "%s", unknown)
	case *t.Throttling:
		row("throttling:", "YES: %s", strings.Join(t.Reasons, "; "))
	default:
		row("throttling:", "no")
	}
	tw.Flush()

	if len(t.Zones) > 0 {
		fmt.Fprintln(w, "thermal zones:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, z := range t.Zones {
			temp := unknown
			switch {
			case z.TempC != nil:
				temp = fmt.Sprintf("%.1f °C", *z.TempC)
			case z.Offline:
				temp = "offline"
			}
			trips := make([]string, len(z.Trips))
			for i, tr := range z.Trips {
				trips[i] = fmt.Sprintf("%s %.1f", tr.Type, tr.TempC)
			}
			mark := ""
			if z.Throttling {
				mark = "  THROTTLING"
			}
			line := fmt.Sprintf("  %s\t%s\t%s", z.Name, orUnknown(z.Type), temp)
			if len(trips) > 0 {
				line += "\ttrips " + strings.Join(trips, ", ")
			}
			fmt.Fprintln(tw, line+mark)
		}
		tw.Flush()
	}
	if len(t.Cooling) > 0 {
		fmt.Fprintln(w, "cooling devices:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range t.Cooling {
			mark := ""
			if c.Throttling {
				mark = "  THROTTLING"
			}
			fmt.Fprintf(tw, "  %s\t%s\tstate %s/%s%s\n", c.Name, orUnknown(c.Type), intOr(c.CurState), intOr(c.MaxState), mark)
		}
		tw.Flush()
	}
	if len(in.Warnings) > 0 {
		fmt.Fprintln(w, "warnings:")
		for _, s := range in.Warnings {
			fmt.Fprintln(w, "  "+s)
		}
	}
	return nil
}

// clusterSummary lists the core clusters and how --lanes names them.
func clusterSummary(topo cpuset.Topology) string {
	var parts []string
	for _, c := range topo {
		capacity := "capacity unknown"
		if c.Capacity > 0 {
			capacity = fmt.Sprintf("capacity %d", c.Capacity)
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", c.CPUs, capacity))
	}
	big, err := topo.Named("big")
	if err != nil { // alike cores: split them in two for the example
		cpus := topo[0].CPUs
		if len(cpus) < 2 {
			return parts[0]
		}
		a, b := cpus[:len(cpus)/2], cpus[len(cpus)/2:]
		return fmt.Sprintf("%s, alike: pin lanes with CPU lists (--lanes %d@%s,%d@%s)", parts[0], len(a), a, len(b), b)
	}
	little, _ := topo.Named("little")
	return fmt.Sprintf("%s: --lanes N@big pins a lane to %s, N@little to %s", strings.Join(parts, ", "), big, little)
}

// cpuSummary gives the online count and the spread of current clocks,
// which is what nvpmodel changes.
func cpuSummary(c jetson.CPU) string {
	s := unknown + " online"
	if c.OnlineCount != nil {
		s = fmt.Sprintf("%d online (%s) of %d", *c.OnlineCount, c.Online, len(c.Cores))
	}
	var cur []uint64
	var maxKHz uint64
	govs := map[string]bool{}
	for _, k := range c.Cores {
		if k.CurKHz != nil {
			cur = append(cur, *k.CurKHz)
		}
		if k.MaxKHz != nil {
			maxKHz = max(maxKHz, *k.MaxKHz)
		}
		if k.Governor != "" {
			govs[k.Governor] = true
		}
	}
	if len(cur) == 0 {
		return s + ", clocks " + unknown
	}
	sort.Slice(cur, func(i, j int) bool { return cur[i] < cur[j] })
	lo, hi := mhz(cur[0]), mhz(cur[len(cur)-1])
	if lo == hi {
		s += ", " + lo
	} else {
		s += ", " + strings.TrimSuffix(lo, " MHz") + "-" + hi
	}
	if maxKHz > 0 {
		s += " (max " + mhz(maxKHz) + ")"
	}
	if len(govs) > 0 {
		names := make([]string, 0, len(govs))
		for g := range govs {
			names = append(names, g)
		}
		sort.Strings(names)
		s += ", governor " + strings.Join(names, "/")
	}
	return s
}

func mhz(khz uint64) string { return fmt.Sprintf("%d MHz", (khz+500)/1000) }

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

func bytesOr(n *uint64) string {
	if n == nil {
		return unknown
	}
	return progress.Bytes(*n)
}

func intOr(n *int64) string {
	if n == nil {
		return "?"
	}
	return fmt.Sprint(*n)
}
