package jetson

import (
	"fmt"
	"strconv"
	"strings"
)

// Board identifies the hardware and its NVIDIA software release.
type Board struct {
	// Model is the device-tree model, e.g. "NVIDIA Jetson AGX Orin Developer Kit".
	Model string `json:"model,omitempty"`
	// Compatible is the device-tree compatible list, most specific first.
	Compatible []string `json:"compatible,omitempty"`
	// SoC is the Tegra SoC, e.g. "tegra234", from the compatible list or the
	// fuse chip id.
	SoC string `json:"soc,omitempty"`
	// Family is the Jetson generation of SoC: "Orin", "Xavier", ...
	Family string `json:"family,omitempty"`
	// ChipID is /sys/module/tegra_fuse/parameters/tegra_chip_id (0x23 on Orin).
	ChipID *int `json:"chip_id,omitempty"`
	// CUDACapability is the integrated GPU's compute capability, e.g. "8.7".
	CUDACapability string `json:"cuda_capability,omitempty"`
	// L4T is /etc/nv_tegra_release, nil when absent.
	L4T *Release `json:"l4t,omitempty"`
	// JetPack is the JetPack release that ships this L4T release; empty
	// when the release is not in tandem's table.
	JetPack string `json:"jetpack,omitempty"`
}

// Release is the L4T (Linux for Tegra) release from /etc/nv_tegra_release.
type Release struct {
	Major         int    `json:"major"`    // 35 for "# R35 (release)"
	Revision      string `json:"revision"` // "4.1"
	Version       string `json:"version"`  // "35.4.1"
	GCID          string `json:"gcid,omitempty"`
	Board         string `json:"board,omitempty"` // BSP board config: t186ref, t210ref, generic
	EABI          string `json:"eabi,omitempty"`
	Date          string `json:"date,omitempty"`
	KernelVariant string `json:"kernel_variant,omitempty"` // "oot" on R36+
}

// soc describes one Tegra generation.
type soc struct {
	name    string
	chipID  int
	family  string
	cudaCap string
}

// socs is keyed by the compatible-string SoC name. Chip ids are the
// tegra_fuse values; compute capabilities are NVIDIA's published ones.
var socs = []soc{
	{"tegra210", 0x21, "TX1/Nano", "5.3"},
	{"tegra186", 0x18, "TX2", "6.2"},
	{"tegra194", 0x19, "Xavier", "7.2"},
	{"tegra234", 0x23, "Orin", "8.7"},
	{"tegra264", 0, "Thor", ""},
}

// jetpackByL4T maps L4T releases to the JetPack that ships them, from
// NVIDIA's JetPack archive. Releases not listed stay unknown rather than
// being guessed from a neighbour.
var jetpackByL4T = map[string]string{
	"32.6.1": "4.6", "32.7.1": "4.6.1", "32.7.2": "4.6.2", "32.7.3": "4.6.3",
	"32.7.4": "4.6.4", "32.7.5": "4.6.5", "32.7.6": "4.6.6",
	"35.1.0": "5.0.2", "35.2.1": "5.1", "35.3.1": "5.1.1", "35.4.1": "5.1.2",
	"35.5.0": "5.1.3", "35.6.0": "5.1.4", "35.6.1": "5.1.5",
	"36.2.0": "6.0 DP", "36.3.0": "6.0", "36.4.0": "6.1", "36.4.3": "6.2", "36.4.4": "6.2.1",
}

// JetPackFor returns the JetPack release for an L4T version such as
// "35.4.1", or "" when it is not known.
func JetPackFor(l4t string) string { return jetpackByL4T[l4t] }

func (p *prober) board() Board {
	var b Board
	// /proc/device-tree is a link to /sys/firmware/devicetree/base; a
	// captured tree may hold either.
	for _, dir := range []string{"/proc/device-tree", "/sys/firmware/devicetree/base"} {
		if b.Model == "" {
			if s, ok := p.readString(dir + "/model"); ok {
				b.Model = s
			}
		}
		if b.Compatible == nil {
			if raw, ok := p.read(dir + "/compatible"); ok {
				b.Compatible = splitNUL(raw)
			}
		}
	}
	for _, c := range b.Compatible {
		if name, ok := strings.CutPrefix(c, "nvidia,tegra"); ok {
			b.SoC = "tegra" + name
			break
		}
	}
	const chipFile = "/sys/module/tegra_fuse/parameters/tegra_chip_id"
	if s, ok := p.readString(chipFile); ok {
		// The kernel prints it in decimal; accept hex too for hand-made trees.
		if n, err := strconv.ParseInt(s, 0, 32); err != nil || n < 0 {
			p.warnf(chipFile, "want a chip id, got %q", clip(s))
		} else {
			id := int(n)
			b.ChipID = &id
		}
	}
	for _, s := range socs {
		if b.SoC == s.name || (b.SoC == "" && b.ChipID != nil && s.chipID != 0 && *b.ChipID == s.chipID) {
			b.SoC, b.Family, b.CUDACapability = s.name, s.family, s.cudaCap
			break
		}
	}
	const relFile = "/etc/nv_tegra_release"
	if raw, ok := p.read(relFile); ok {
		r, err := ParseTegraRelease(raw)
		if err != nil {
			p.warnf(relFile, "%v", err)
		} else {
			b.L4T = &r
			b.JetPack = JetPackFor(r.Version)
		}
	}
	return b
}

// splitNUL splits a device-tree string list.
func splitNUL(b []byte) []string {
	var out []string
	for _, s := range strings.Split(string(b), "\x00") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParseTegraRelease parses /etc/nv_tegra_release, whose first line reads
// "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI:
// aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023". Lines after it (checksums,
// "# KERNEL_VARIANT: oot", TARGET_USERSPACE_* settings) are optional.
func ParseTegraRelease(b []byte) (Release, error) {
	var r Release
	lines := strings.Split(string(b), "\n")
	head := strings.TrimSpace(lines[0])
	rest, ok := strings.CutPrefix(head, "# R")
	if !ok {
		return r, fmt.Errorf("first line %q does not start with \"# R<major> (release)\"", clip(head))
	}
	major, rest, ok := strings.Cut(rest, " ")
	n, err := strconv.Atoi(major)
	if !ok || err != nil || n < 0 {
		return r, fmt.Errorf("bad release major %q", clip(major))
	}
	r.Major = n
	// The fields are "KEY: value" separated by ", "; DATE's value has no
	// commas, so a plain split is exact.
	for _, f := range strings.Split(rest, ",") {
		key, val, ok := strings.Cut(f, ":")
		if !ok {
			continue // "(release)"
		}
		val = strings.TrimSpace(val)
		switch strings.TrimSpace(key) {
		case "REVISION":
			r.Revision = val
		case "GCID":
			r.GCID = val
		case "BOARD":
			r.Board = val
		case "EABI":
			r.EABI = val
		case "DATE":
			r.Date = val
		}
	}
	if r.Revision == "" {
		return r, fmt.Errorf("no REVISION in %q", clip(head))
	}
	for _, part := range strings.Split(r.Revision, ".") {
		if _, err := strconv.ParseUint(part, 10, 32); err != nil {
			return r, fmt.Errorf("bad REVISION %q", clip(r.Revision))
		}
	}
	r.Version = strconv.Itoa(r.Major) + "." + r.Revision
	for _, l := range lines[1:] {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "# KERNEL_VARIANT:"); ok {
			r.KernelVariant = strings.TrimSpace(v)
		}
	}
	return r, nil
}
