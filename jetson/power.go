package jetson

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// PowerMode is the nvpmodel power mode: a named cap on CPU cores and CPU,
// GPU and memory clocks. Decode speed depends on it directly.
type PowerMode struct {
	ID   int    `json:"id"`
	Name string `json:"name,omitempty"` // "MAXN", "15W", "MODE_20W_6CORE"
	// Source is where the mode came from: "nvpmodel -q",
	// "/var/lib/nvpmodel/status" (what nvpmodel saved when it last set a
	// mode) or "/etc/nvpmodel.conf default" (nothing saved yet, so the boot
	// default applies).
	Source  string `json:"source"`
	FanMode string `json:"fan_mode,omitempty"`
	// DefaultID is the boot default from /etc/nvpmodel.conf.
	DefaultID *int `json:"default_id,omitempty"`
	// Modes lists the modes /etc/nvpmodel.conf defines. The fastest is not
	// necessarily the highest id (Orin Nano Super: 15W=0, 25W=1,
	// MAXN_SUPER=2, 7W=3).
	Modes []ModeDef `json:"modes,omitempty"`
}

// ModeDef is one POWER_MODEL entry of nvpmodel.conf.
type ModeDef struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

const (
	nvpConfFile   = "/etc/nvpmodel.conf"
	nvpStatusFile = "/var/lib/nvpmodel/status"
)

func (p *prober) power() *PowerMode {
	var modes []ModeDef
	var def *int
	if raw, ok := p.read(nvpConfFile); ok {
		ms, d, err := ParseNvpmodelConf(raw)
		if err != nil {
			p.warnf(nvpConfFile, "%v", err)
		}
		modes, def = ms, d
	}
	var pm *PowerMode
	if p.nvpmodel != nil {
		ctx, cancel := context.WithTimeout(context.Background(), nvpmodelTimeout)
		out, err := p.nvpmodel(ctx)
		cancel()
		if err != nil {
			p.warnf("nvpmodel -q", "%v", err)
		} else if m, err := ParseNvpmodelQuery(out); err != nil {
			p.warnf("nvpmodel -q", "%v", err)
		} else {
			m.Source = "nvpmodel -q"
			pm = &m
		}
	}
	if pm == nil {
		if raw, ok := p.read(nvpStatusFile); ok {
			id, fan, err := ParseNvpmodelStatus(raw)
			if err != nil {
				p.warnf(nvpStatusFile, "%v", err)
			} else {
				pm = &PowerMode{ID: id, Source: nvpStatusFile, FanMode: fan}
			}
		}
	}
	if pm == nil && def != nil && len(modes) > 0 {
		// nvpmodel writes status the first time it sets a mode; until then
		// the board runs the configured default.
		pm = &PowerMode{ID: *def, Source: nvpConfFile + " default"}
	}
	if pm == nil {
		return nil
	}
	pm.DefaultID, pm.Modes = def, modes
	if pm.Name == "" {
		for _, m := range modes {
			if m.ID == pm.ID {
				pm.Name = m.Name
			}
		}
	}
	return pm
}

// ParseNvpmodelQuery parses the output of "nvpmodel -q":
//
//	NV Fan Mode:quiet
//	NV Power Mode: MAXN
//	0
//
// The fan line and "NVPM WARN" lines are optional.
func ParseNvpmodelQuery(b []byte) (PowerMode, error) {
	var m PowerMode
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if v, ok := strings.CutPrefix(line, "NV Fan Mode:"); ok {
			m.FanMode = strings.TrimSpace(v)
			continue
		}
		v, ok := strings.CutPrefix(line, "NV Power Mode:")
		if !ok {
			continue
		}
		m.Name = strings.TrimSpace(v)
		if m.Name == "" {
			return m, fmt.Errorf("empty power mode name")
		}
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) == ""; i++ {
		}
		if i == len(lines) {
			return m, fmt.Errorf("no mode id after \"NV Power Mode: %s\"", clip(m.Name))
		}
		id, err := parseModeID(strings.TrimSpace(lines[i]))
		if err != nil {
			return m, err
		}
		m.ID = id
		return m, nil
	}
	return m, fmt.Errorf("no \"NV Power Mode:\" line")
}

func parseModeID(s string) (int, error) {
	// Mode ids are small; bounding them keeps a garbage file from
	// producing a plausible-looking huge id.
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("bad mode id %q", clip(s))
	}
	return int(n), nil
}

// ParseNvpmodelStatus parses /var/lib/nvpmodel/status, which nvpmodel
// writes as "pmode:0002" optionally followed by " fmode:quiet".
func ParseNvpmodelStatus(b []byte) (id int, fanMode string, err error) {
	found := false
	for _, f := range strings.Fields(string(b)) {
		k, v, ok := strings.Cut(f, ":")
		if !ok {
			return 0, "", fmt.Errorf("want \"pmode:NNNN\", got %q", clip(f))
		}
		switch k {
		case "pmode":
			if id, err = parseModeID(v); err != nil {
				return 0, "", err
			}
			found = true
		case "fmode":
			fanMode = v
		}
	}
	if !found {
		return 0, "", fmt.Errorf("no pmode")
	}
	return id, fanMode, nil
}

// ParseNvpmodelConf extracts the mode list and boot default from an
// nvpmodel.conf: lines "< POWER_MODEL ID=0 NAME=MAXN >" and
// "< PM_CONFIG DEFAULT=2 >"; parameter lines and comments are ignored.
// Malformed tag lines are named in the error, the rest still returned.
func ParseNvpmodelConf(b []byte) (modes []ModeDef, def *int, err error) {
	var bad []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		body, ok := strings.CutPrefix(line, "<")
		if !ok {
			continue
		}
		body, ok = strings.CutSuffix(body, ">")
		f := strings.Fields(body)
		if !ok || len(f) == 0 {
			bad = append(bad, fmt.Sprintf("line %d: unterminated tag %q", i+1, clip(line)))
			continue
		}
		kv := map[string]string{}
		for _, a := range f[1:] {
			if k, v, ok := strings.Cut(a, "="); ok {
				kv[k] = v
			}
		}
		switch f[0] {
		case "POWER_MODEL":
			id, err := parseModeID(kv["ID"])
			if err != nil || kv["NAME"] == "" {
				bad = append(bad, fmt.Sprintf("line %d: want \"< POWER_MODEL ID=n NAME=s >\", got %q", i+1, clip(line)))
				continue
			}
			modes = append(modes, ModeDef{ID: id, Name: kv["NAME"]})
		case "PM_CONFIG":
			d, err := parseModeID(kv["DEFAULT"])
			if err != nil {
				bad = append(bad, fmt.Sprintf("line %d: want \"< PM_CONFIG DEFAULT=n >\", got %q", i+1, clip(line)))
				continue
			}
			def = &d
		}
	}
	return modes, def, lineErrors(bad)
}
