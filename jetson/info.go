// Package jetson probes the platform tandem runs on: which NVIDIA Jetson
// board (if any), its unified memory, nvpmodel power mode, thermal and
// throttling state, GPU load and CPU clocks.
//
// Everything is read relative to a root directory so that a captured tree
// (or a test fixture) can be inspected like a live system. The convention
// for what could not be learned is the zero value, omitted from JSON: an
// empty string, a nil pointer or slice. Numbers are pointers because zero is
// a real reading. A missing file means "unknown"; a file that exists but
// cannot be read or parsed adds a line to Info.Warnings and is otherwise
// treated as unknown, so a probe never fails because of one odd file.
package jetson

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Info is one snapshot of the platform.
type Info struct {
	// Root is the directory the files were read from ("/" for this machine).
	Root string `json:"root"`
	// Jetson is true when the tree shows a Tegra SoC or an L4T release.
	Jetson bool   `json:"jetson"`
	Board  Board  `json:"board"`
	Kernel string `json:"kernel,omitempty"`
	Memory Memory `json:"memory"`
	// Power is the nvpmodel power mode, nil when unknown (always off-Jetson).
	Power *PowerMode `json:"power_mode,omitempty"`
	// GPU is the integrated GPU's state, nil when unknown (always off-Jetson).
	GPU     *GPU    `json:"gpu,omitempty"`
	CPU     CPU     `json:"cpu"`
	Thermal Thermal `json:"thermal"`
	// Warnings lists files that exist but could not be read or parsed, as
	// "PATH: reason" with PATH under Root (or "nvpmodel -q: reason" when
	// that command failed).
	Warnings []string `json:"warnings,omitempty"`
}

// Local probes this machine.
func Local() (Info, error) { return newProber("/", true).probe() }

// Probe reads the platform files under root. It fails only when root is
// not a readable directory; everything below it is best effort.
func Probe(root string) (Info, error) {
	abs, err := filepath.Abs(root)
	live := err == nil && abs == string(filepath.Separator)
	return newProber(root, live).probe()
}

func newProber(root string, live bool) *prober {
	p := &prober{root: filepath.Clean(root), live: live}
	// Only the live system can run nvpmodel or ask the OS (gopsutil); a
	// captured tree has just its files.
	if live {
		if path, err := exec.LookPath("nvpmodel"); err == nil {
			p.nvpmodel = func(ctx context.Context) ([]byte, error) {
				return exec.CommandContext(ctx, path, "-q").Output()
			}
		}
	}
	return p
}

// prober carries the root and collects warnings while reading.
type prober struct {
	root string
	live bool
	// nvpmodel runs "nvpmodel -q"; nil when the binary is absent or the
	// root is not the live system. A field so tests can substitute it.
	nvpmodel func(ctx context.Context) ([]byte, error)
	warnings []string
}

func (p *prober) probe() (Info, error) {
	st, err := os.Stat(p.root)
	if err != nil {
		return Info{}, fmt.Errorf("jetson: probe root: %w", err)
	}
	if !st.IsDir() {
		return Info{}, fmt.Errorf("jetson: probe root %s: not a directory", p.root)
	}
	info := Info{Root: p.root}
	info.Board = p.board()
	info.Jetson = info.Board.L4T != nil || strings.HasPrefix(info.Board.SoC, "tegra") || info.Board.ChipID != nil
	if s, ok := p.readString("/proc/sys/kernel/osrelease"); ok {
		info.Kernel = s
	}
	info.Memory = p.memory(info.Jetson)
	info.Power = p.power()
	if info.Jetson {
		info.GPU = p.gpu()
	}
	info.CPU = p.cpu()
	info.Thermal = p.thermal()
	info.Warnings = p.warnings
	return info, nil
}

// maxFileBytes bounds every read: platform files are small, and a --root
// pointed at the wrong place must not read gigabytes.
const maxFileBytes = 1 << 20

// path maps a slash path under the root ("/proc/meminfo") to the OS path.
func (p *prober) path(rel string) string {
	return filepath.Join(p.root, filepath.FromSlash(rel))
}

func (p *prober) warnf(rel, format string, args ...any) {
	p.warnings = append(p.warnings, rel+": "+fmt.Sprintf(format, args...))
}

// read returns a file's bytes; ok is false when it is absent (unknown) or
// unreadable (warned).
func (p *prober) read(rel string) ([]byte, bool) {
	b, err := p.readErr(rel)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			p.warnf(rel, "%v", unwrapPath(err))
		}
		return nil, false
	}
	return b, true
}

// readErr reads a file without warning, for callers that judge errors.
func (p *prober) readErr(rel string) ([]byte, error) {
	f, err := os.Open(p.path(rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxFileBytes)
	}
	return b, nil
}

// unwrapPath drops the OS path from a *PathError: warnings already name
// the file relative to the root.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// trimValue strips whitespace and the NUL terminators device-tree strings
// carry.
func trimValue(b []byte) string {
	return strings.Trim(string(b), " \t\r\n\x00")
}

// resolve follows symlinks in a path under the root and returns the real
// path, still relative to the root; rel itself when that fails or leads
// outside the root (a captured tree with absolute links).
func (p *prober) resolve(rel string) string {
	real, err := filepath.EvalSymlinks(p.path(rel))
	if err != nil {
		return rel
	}
	root, err := filepath.EvalSymlinks(p.root)
	if err != nil {
		return rel
	}
	r, err := filepath.Rel(root, real)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return rel
	}
	return "/" + filepath.ToSlash(r)
}

// exists reports whether a path under the root exists.
func (p *prober) exists(rel string) bool {
	_, err := os.Stat(p.path(rel))
	return err == nil
}

// readString reads a one-value file; ok is false when absent, unreadable
// or empty.
func (p *prober) readString(rel string) (string, bool) {
	b, ok := p.read(rel)
	if !ok {
		return "", false
	}
	s := trimValue(b)
	return s, s != ""
}

// readInt reads a file holding one decimal integer, warning when it holds
// something else.
func (p *prober) readInt(rel string) (int64, bool) {
	s, ok := p.readString(rel)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		p.warnf(rel, "want an integer, got %q", clip(s))
		return 0, false
	}
	return n, true
}

// readUint is readInt for values that cannot be negative.
func (p *prober) readUint(rel string) (*uint64, bool) {
	n, ok := p.readInt(rel)
	if !ok {
		return nil, false
	}
	if n < 0 {
		p.warnf(rel, "want a non-negative integer, got %d", n)
		return nil, false
	}
	u := uint64(n)
	return &u, true
}

// entries lists the names in a directory under the root that match re,
// sorted by their first number so that thermal_zone10 follows
// thermal_zone9. A missing directory gives nil.
func (p *prober) entries(dir string, re *regexp.Regexp) []string {
	des, err := os.ReadDir(p.path(dir))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			p.warnf(dir, "%v", unwrapPath(err))
		}
		return nil
	}
	var names []string
	for _, de := range des {
		if re.MatchString(de.Name()) {
			names = append(names, de.Name())
		}
	}
	sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
	return names
}

var firstNumber = regexp.MustCompile(`\d+`)

func naturalLess(a, b string) bool {
	na, nb := firstNumber.FindString(a), firstNumber.FindString(b)
	if na != "" && nb != "" && len(na) != len(nb) {
		return len(na) < len(nb)
	}
	return a < b
}

// clip shortens a value quoted in a warning.
func clip(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// nvpmodelTimeout bounds "nvpmodel -q", which should answer at once; a
// hung helper must not hang the probe.
const nvpmodelTimeout = 5 * time.Second
