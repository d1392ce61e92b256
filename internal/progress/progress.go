// Package progress reports the progress of long jobs: a one-line bar
// redrawn in place on a terminal, a plain line now and then when the
// output is a file or a pipe (a CI log, nohup, a service's journal), and
// nothing at all on other writers (tests' buffers).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// mode is how a bar reports.
type mode int

const (
	silent mode = iota
	drawn       // a terminal: one line, redrawn in place
	logged      // a file or pipe: whole lines, at most one per logEvery
)

// A job shorter than logFirst writes nothing to a log, so quick commands
// keep their logs clean; a longer one shows it is alive every logEvery.
// A 300-second benchmark on a GPU machine once logged nothing past its
// first phase and could not be told from a hung one.
const (
	logFirst = 10 * time.Second
	logEvery = 30 * time.Second
)

// Bar reports progress of a job of known total size, in bytes or in
// counted items.
type Bar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	unit  string // the items counted; "" for bytes
	total uint64
	start time.Time
	last  time.Time // the last draw, or the last logged line
	mode  mode
	wrote bool // a logged bar has written a line, so Done writes its last
	now   func() time.Time
}

// New returns a bar of bytes writing to w: drawn when w is a terminal,
// logged when it is another file, silent otherwise.
func New(w io.Writer, label string, total uint64) *Bar {
	m := silent
	if IsTerminal(w) {
		m = drawn
	} else if _, ok := w.(*os.File); ok {
		m = logged
	}
	return newBar(w, label, total, m, time.Now)
}

func newBar(w io.Writer, label string, total uint64, m mode, now func() time.Time) *Bar {
	return &Bar{w: w, label: label, total: total, start: now(), mode: m, now: now}
}

// NewCount returns a bar that counts items, such as "runs", instead of
// bytes.
func NewCount(w io.Writer, label string, total uint64, unit string) *Bar {
	b := New(w, label, total)
	b.unit = unit
	return b
}

// IsTerminal reports whether w is a character device such as a tty.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Set records done bytes (or items): a terminal's bar is redrawn at most
// ten times a second, a log gets a line at most every logEvery.
func (b *Bar) Set(done uint64) {
	if b == nil || b.mode == silent {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	switch b.mode {
	case drawn:
		if now.Sub(b.last) < 100*time.Millisecond && done < b.total {
			return
		}
		b.draw(done, now)
	case logged:
		if now.Sub(b.start) < logFirst || (b.wrote && now.Sub(b.last) < logEvery) {
			return
		}
		b.log(done, now)
	}
	b.last = now
}

// rate and eta are the job's speed so far and the time left at it ("--"
// when unknown or done).
func (b *Bar) rate(done uint64, now time.Time) (rate float64, eta string) {
	rate = float64(done) / max(now.Sub(b.start).Seconds(), 1e-9)
	eta = "--"
	if rate > 0 && done < b.total {
		eta = time.Duration(float64(b.total-done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	return rate, eta
}

func (b *Bar) draw(done uint64, now time.Time) {
	frac := 1.0
	if b.total > 0 {
		frac = min(1, float64(done)/float64(b.total))
	}
	const width = 30
	fill := int(frac * width)
	rate, eta := b.rate(done, now)
	speed := Bytes(uint64(rate)) + "/s"
	if b.unit != "" {
		speed = fmt.Sprintf("%d/%d %s, %.3g/s", done, b.total, b.unit, rate)
	}
	fmt.Fprintf(b.w, "\r%s [%s%s] %5.1f%% %s eta %s   ", b.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		100*frac, speed, eta)
}

// log writes one plain line: what is done of what, the speed, and the
// time left, e.g. "real-engine runs: 12/36 runs (33.3%), 0.05/s, eta 4m0s".
func (b *Bar) log(done uint64, now time.Time) {
	rate, eta := b.rate(done, now)
	amount, speed := Bytes(done), Bytes(uint64(rate))+"/s"
	if b.unit != "" {
		amount, speed = fmt.Sprintf("%d", done), fmt.Sprintf("%.3g/s", rate)
	}
	line := b.label + ": " + amount
	if b.total > 0 {
		whole := Bytes(b.total)
		if b.unit != "" {
			whole = fmt.Sprintf("%d %s", b.total, b.unit)
		}
		line += fmt.Sprintf(" of %s (%.1f%%), %s, eta %s", whole, 100*min(1, float64(done)/float64(b.total)), speed, eta)
	} else {
		if b.unit != "" {
			line += " " + b.unit
		}
		line += ", " + speed
	}
	fmt.Fprintln(b.w, line)
	b.wrote = true
}

// Done finishes the line: a terminal's bar is drawn full, and a log that
// had lines gets a last one with the time the job took.
func (b *Bar) Done() {
	if b == nil || b.mode == silent {
		return
	}
	switch b.mode {
	case drawn:
		b.Set(b.total)
		fmt.Fprintln(b.w)
	case logged:
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.wrote {
			fmt.Fprintf(b.w, "%s: done in %s\n", b.label, b.now().Sub(b.start).Round(time.Second))
		}
	}
}

// Bytes formats n with a binary unit (KiB, MiB, GiB).
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// SetTotal changes the total, for jobs that learn it late.
func (b *Bar) SetTotal(total uint64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.total = total
	b.mu.Unlock()
}
