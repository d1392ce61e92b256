// Package progress draws a one-line progress bar on a terminal and stays
// silent when its output is not one (pipes, CI logs, tests).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Bar reports progress of a job of known total size, in bytes or in
// counted items.
type Bar struct {
	mu      sync.Mutex
	w       io.Writer
	label   string
	unit    string // the items counted; "" for bytes
	total   uint64
	start   time.Time
	last    time.Time
	enabled bool
}

// New returns a bar of bytes writing to w, drawn only when w is a terminal.
func New(w io.Writer, label string, total uint64) *Bar {
	return &Bar{w: w, label: label, total: total, start: time.Now(), enabled: IsTerminal(w)}
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

// Set records done bytes, redrawing at most ten times a second.
func (b *Bar) Set(done uint64) {
	if b == nil || !b.enabled {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if now.Sub(b.last) < 100*time.Millisecond && done < b.total {
		return
	}
	b.last = now
	frac := 1.0
	if b.total > 0 {
		frac = min(1, float64(done)/float64(b.total))
	}
	const width = 30
	fill := int(frac * width)
	elapsed := now.Sub(b.start).Seconds()
	rate := float64(done) / max(elapsed, 1e-9)
	eta := "--"
	if rate > 0 && done < b.total {
		eta = time.Duration(float64(b.total-done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	speed := Bytes(uint64(rate)) + "/s"
	if b.unit != "" {
		speed = fmt.Sprintf("%d/%d %s, %.3g/s", done, b.total, b.unit, rate)
	}
	fmt.Fprintf(b.w, "\r%s [%s%s] %5.1f%% %s eta %s   ", b.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		100*frac, speed, eta)
}

// Done finishes the line.
func (b *Bar) Done() {
	if b == nil || !b.enabled {
		return
	}
	b.Set(b.total)
	fmt.Fprintln(b.w)
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
