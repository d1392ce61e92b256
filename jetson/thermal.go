package jetson

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Thermal is the state of the kernel's thermal zones and cooling devices.
type Thermal struct {
	Zones   []Zone          `json:"zones,omitempty"`
	Cooling []CoolingDevice `json:"cooling_devices,omitempty"`
	// Throttling is true when some zone is at or above a passive, hot or
	// critical trip point or some non-fan cooling device is engaged; nil
	// when there is nothing to judge by. Jetson's BPMP can also cap clocks
	// in firmware, which sysfs does not show.
	Throttling *bool `json:"throttling,omitempty"`
	// Reasons names each zone or device behind Throttling.
	Reasons []string `json:"reasons,omitempty"`
}

// Zone is one /sys/class/thermal/thermal_zoneN.
type Zone struct {
	Name string `json:"name"`           // thermal_zone0
	Type string `json:"type,omitempty"` // cpu-thermal, CPU-therm, x86_pkg_temp, acpitz
	// TempC is nil when the sensor is offline or its reading unusable.
	TempC *float64 `json:"temp_c,omitempty"`
	// Offline is true when the sensor says it is off (Orin's cv*-thermal
	// zones while their engines are power gated).
	Offline    bool   `json:"offline,omitempty"`
	Trips      []Trip `json:"trips,omitempty"`
	Throttling bool   `json:"throttling,omitempty"`
}

// Trip is a trip point: the temperature at which the kernel acts.
type Trip struct {
	Type  string  `json:"type"` // active (fans), passive (clock caps), hot, critical (shutdown)
	TempC float64 `json:"temp_c"`
}

// CoolingDevice is one /sys/class/thermal/cooling_deviceN.
type CoolingDevice struct {
	Name       string `json:"name"`           // cooling_device0
	Type       string `json:"type,omitempty"` // pwm-fan, Processor, intel_powerclamp
	CurState   *int64 `json:"cur_state,omitempty"`
	MaxState   *int64 `json:"max_state,omitempty"`
	Throttling bool   `json:"throttling,omitempty"`
}

const thermalClass = "/sys/class/thermal"

var (
	zoneDir    = regexp.MustCompile(`^thermal_zone[0-9]+$`)
	coolingDir = regexp.MustCompile(`^cooling_device[0-9]+$`)
	tripTemp   = regexp.MustCompile(`^trip_point_([0-9]+)_temp$`)
)

// offlineMilliC is what Tegra thermal drivers report for a sensor that is
// off; tegrastats prints it as "-256C".
const offlineMilliC = -256000

func (p *prober) thermal() Thermal {
	var t Thermal
	judged := false
	for _, e := range p.entries(thermalClass, zoneDir) {
		z := p.zone(thermalClass + "/" + e)
		z.Name = e
		if z.TempC != nil {
			judged = true
			for _, tr := range z.Trips {
				if throttleTrip(tr.Type) && *z.TempC >= tr.TempC {
					z.Throttling = true
					t.Reasons = append(t.Reasons, fmt.Sprintf("%s (%s) at %.1f °C, %s trip %.1f °C", e, z.Type, *z.TempC, tr.Type, tr.TempC))
					break
				}
			}
		}
		t.Zones = append(t.Zones, z)
	}
	for _, e := range p.entries(thermalClass, coolingDir) {
		dir := thermalClass + "/" + e
		c := CoolingDevice{Name: e}
		c.Type, _ = p.readString(dir + "/type")
		if n, ok := p.readInt(dir + "/cur_state"); ok {
			c.CurState = &n
		}
		if n, ok := p.readInt(dir + "/max_state"); ok {
			c.MaxState = &n
		}
		if c.CurState != nil {
			judged = true
			if *c.CurState > 0 && throttleDevice(c.Type) {
				c.Throttling = true
				lim := "?"
				if c.MaxState != nil {
					lim = strconv.FormatInt(*c.MaxState, 10)
				}
				t.Reasons = append(t.Reasons, fmt.Sprintf("%s (%s) at state %d/%s", e, c.Type, *c.CurState, lim))
			}
		}
		t.Cooling = append(t.Cooling, c)
	}
	if judged {
		th := len(t.Reasons) > 0
		t.Throttling = &th
	}
	return t
}

func (p *prober) zone(dir string) Zone {
	var z Zone
	z.Type, _ = p.readString(dir + "/type")
	raw, err := p.readErr(dir + "/temp")
	switch {
	case err == nil:
		s := trimValue(raw)
		if n, err := strconv.ParseInt(s, 10, 64); err != nil {
			p.warnf(dir+"/temp", "want millidegrees C, got %q", clip(s))
		} else if n <= offlineMilliC {
			z.Offline = true
		} else {
			c := float64(n) / 1000
			z.TempC = &c
		}
	case errors.Is(err, fs.ErrNotExist):
	case offlineErr(err):
		// An offline sensor refuses the read; that is its state, not a fault.
		z.Offline = true
	default:
		p.warnf(dir+"/temp", "%v", unwrapPath(err))
	}
	for _, e := range p.entries(dir, tripTemp) {
		n := tripTemp.FindStringSubmatch(e)[1]
		typ, ok := p.readString(dir + "/trip_point_" + n + "_type")
		if !ok {
			continue
		}
		milli, ok := p.readInt(dir + "/" + e)
		// Drivers park unused trips at 0 (x86_pkg_temp) or far below zero
		// (iwlwifi); those would read as "always exceeded".
		if !ok || milli <= 0 {
			continue
		}
		z.Trips = append(z.Trips, Trip{Type: typ, TempC: float64(milli) / 1000})
	}
	return z
}

// offlineErr reports the errors Tegra (BPMP) thermal sensors return while
// their power domain is off.
func offlineErr(err error) bool {
	return errors.Is(err, syscall.EAGAIN) ||
		errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EINVAL)
}

// throttleTrip reports whether crossing a trip of this type caps clocks
// (passive) or means the kernel is about to (hot, critical); active trips
// only spin fans.
func throttleTrip(typ string) bool {
	switch strings.ToLower(typ) {
	case "passive", "hot", "critical":
		return true
	}
	return false
}

// throttleDevice reports whether a cooling device slows the system when
// engaged. Fans cool without slowing anything; Intel's "TCC Offset" state
// is a configured offset, not a live action.
func throttleDevice(typ string) bool {
	t := strings.ToLower(typ)
	return !strings.Contains(t, "fan") && t != "tcc offset"
}
