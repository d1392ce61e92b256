package weights

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-llm/tandem/internal/progress"
)

// StreamMode says whether the Streamer reads ahead.
type StreamMode int

const (
	// StreamPipelined reads the next streamed groups while the current
	// one computes (the StdPL baseline and tandem's mode).
	StreamPipelined StreamMode = iota
	// StreamStd reads a group when it is needed and computes after the
	// read finishes: no overlap (the Std baseline).
	StreamStd
)

func (m StreamMode) String() string {
	if m == StreamStd {
		return "std"
	}
	return "stdpl"
}

// IOMethod is how streamed bytes reach memory.
type IOMethod int

const (
	// IOPread reads groups with pread into a ring buffer the Streamer
	// owns and drops the page cache behind every chunk. Resident bytes are
	// exactly the buffers', a changed file is a short read rather than a
	// SIGBUS, and measured on this project's machines it streams as fast
	// as the mapping (see README, Performance): the default.
	IOPread IOMethod = iota
	// IOMmap computes on the file mapping: prefetch touches the pages
	// (after MADV_WILLNEED), release drops them with MADV_DONTNEED and
	// POSIX_FADV_DONTNEED. Kept to measure against IOPread.
	IOMmap
)

func (m IOMethod) String() string {
	if m == IOMmap {
		return "mmap"
	}
	return "pread"
}

// Throttle emulates slower storage: streamed reads proceed at no more
// than Bandwidth bytes/s and each read request waits Latency first.
// The zero value reads at the disk's own speed.
type Throttle struct {
	Bandwidth float64 // bytes per second; 0 = unthrottled
	Latency   time.Duration
}

// Group is a set of tensors that compute together (one transformer
// layer, the output head) and so are read, kept and released together.
type Group struct {
	Name    string
	Tensors []string
	// Rows marks a group compute reads a few rows of (the token
	// embedding of an untied model): it is pinned when the budget has room
	// after every other group, and otherwise read row by row with
	// ReadTensorAt, never streamed whole.
	Rows bool
}

// StreamOptions configures a Streamer.
type StreamOptions struct {
	// Budget is the most target-weight bytes resident at once: pinned
	// groups plus the streaming window.
	Budget uint64
	Mode   StreamMode
	Method IOMethod
	// Throttle slows streamed reads to emulate flash.
	Throttle Throttle
	// ChunkBytes is the size of one read request (default 4 MiB): the
	// page cache never holds more than about this much of the file.
	ChunkBytes int
}

const defaultChunk = 4 << 20

// StreamPlan is what a budget buys: which groups stay resident and how
// large the streaming window is.
type StreamPlan struct {
	Budget   uint64
	Total    uint64 // bytes of all groups
	Pinned   []bool // per group
	PinBytes uint64 // bytes of pinned groups
	Window   uint64 // bytes of the streaming window
	// Min is the smallest budget the groups allow in this mode: the
	// largest group (it must be whole in memory to compute).
	Min uint64
}

// Streamed is the bytes read per pass (one Forward): every group not
// pinned, except row-read groups, whose few rows per token are not
// counted here.
func (p StreamPlan) Streamed(groups []Group, f *File) uint64 {
	sizes, err := groupSizes(f, groups)
	if err != nil {
		return 0
	}
	var n uint64
	for i, s := range sizes {
		if !p.Pinned[i] && !groups[i].Rows {
			n += s
		}
	}
	return n
}

// ErrBudget reports a budget too small for the model.
var ErrBudget = errors.New("budget too small")

// PlanStream decides which groups of f stay pinned under opt.Budget.
// Everything streams through a window of one largest group (Std) or two
// (StdPL, so the next group reads while one computes, when the budget
// allows); what remains of the budget pins groups spread through the pass
// (see spread), because each pinned byte is a byte not read per token. A
// budget of at least the total pins everything and streams nothing.
func PlanStream(f *File, groups []Group, opt StreamOptions) (StreamPlan, error) {
	sizes, err := groupSizes(f, groups)
	if err != nil {
		return StreamPlan{}, err
	}
	p := StreamPlan{Budget: opt.Budget, Pinned: make([]bool, len(groups))}
	for i, s := range sizes {
		p.Total += s
		if !groups[i].Rows {
			p.Min = max(p.Min, s)
		}
	}
	if opt.Budget >= p.Total {
		for i := range p.Pinned {
			p.Pinned[i] = true
		}
		p.PinBytes = p.Total
		return p, nil
	}
	if opt.Budget < p.Min {
		return p, fmt.Errorf("%w: %s needs at least %s (its largest layer must fit whole); got %s",
			ErrBudget, f.Path, progress.Bytes(p.Min), progress.Bytes(opt.Budget))
	}
	p.Window = p.Min
	if opt.Mode == StreamPipelined {
		p.Window = min(opt.Budget, 2*p.Min)
	}
	free := opt.Budget - p.Window
	pin := func(i int) {
		if !p.Pinned[i] && sizes[i] <= free {
			p.Pinned[i] = true
			p.PinBytes += sizes[i]
			free -= sizes[i]
		}
	}
	for _, i := range spread(sizes, groups, free) {
		pin(i)
	}
	for _, rows := range []bool{false, true} {
		for i := range sizes {
			if groups[i].Rows == rows {
				pin(i)
			}
		}
	}
	// Bytes no group can use widen the window, letting reads run further
	// ahead.
	p.Window += free
	return p, nil
}

// spread picks the most compute-order groups (not row-read) that fit in
// free, evenly spaced through the pass. Pinned groups spread out keep the
// pipelined reader busy: while a pinned group computes, the reader fills
// the window with the streamed groups after it. Pinned in a run, the
// reader would sit with a full window through the whole run's compute.
func spread(sizes []uint64, groups []Group, free uint64) []int {
	var idx []int
	for i, g := range groups {
		if !g.Rows {
			idx = append(idx, i)
		}
	}
	n := len(idx)
	for k := n; k > 0; k-- {
		pick := make([]int, k)
		var sum uint64
		for j := range pick {
			pick[j] = idx[(2*j+1)*n/(2*k)]
			sum += sizes[pick[j]]
		}
		if sum <= free {
			return pick
		}
	}
	return nil
}

func groupSizes(f *File, groups []Group) ([]uint64, error) {
	sizes := make([]uint64, len(groups))
	for i, g := range groups {
		if len(g.Tensors) == 0 {
			return nil, fmt.Errorf("stream: group %q has no tensors", g.Name)
		}
		for _, name := range g.Tensors {
			t, ok := f.Tensor(name)
			if !ok {
				return nil, fmt.Errorf("stream: %s: tensor %q of group %q is missing", f.Path, name, g.Name)
			}
			sizes[i] += t.Size
		}
	}
	return sizes, nil
}

// GroupStats are one group's counters.
type GroupStats struct {
	Name     string
	Bytes    uint64
	Pinned   bool
	Reads    int           // times streamed in
	ReadTime time.Duration // time its reads took (reader side)
	Stall    time.Duration // time compute waited for it
	Compute  time.Duration // time between Acquire returning and Release
}

// StreamStats are a Streamer's counters since it was made.
type StreamStats struct {
	Mode     StreamMode
	Method   IOMethod
	Budget   uint64
	Pinned   uint64 // bytes of pinned groups
	Window   uint64 // bytes of the streaming window
	Resident uint64 // target-weight bytes in memory now
	Peak     uint64 // most Resident ever was
	// WarmupRead is the bytes read to pin groups; BytesRead counts the
	// streamed bytes (and embedding rows) read afterwards.
	WarmupRead uint64
	BytesRead  uint64
	// Ahead is the part of BytesRead read ahead of compute: groups loaded
	// into the window that no Acquire has taken yet. BytesRead − Ahead is
	// what the passes so far consumed, whatever the reader was doing when
	// the counters were read.
	Ahead    uint64
	ReadTime time.Duration // time spent reading (reader side)
	Stall    time.Duration // time compute waited on IO
	Passes   int           // completed passes over the groups
	Groups   []GroupStats
}

// Streamer keeps a model's pinned groups resident and streams the others
// through a bounded window in compute order. Compute calls Acquire(g)
// and Release(g) for every group of a pass in order; in pipelined mode a
// reader goroutine fills the window with the groups that come next,
// wrapping to the first streamed group after the last (the next token
// reads the same groups in the same order).
//
// Methods are safe for one compute goroutine plus Stats from any.
type Streamer struct {
	f      *File
	fh     *os.File
	groups []Group
	plan   StreamPlan
	opt    StreamOptions
	io     ioThrottle

	// views[g] are the tensors of pinned groups (always valid) or, for
	// streamed groups, of their place in the window while loaded.
	tensors [][]*Tensor
	pinned  [][][]byte // views of pinned groups
	pinMem  []byte     // backing of pinned groups (pread)
	ring    []byte     // the streaming window (pread)

	order []int // streamed groups in compute order
	last  int   // the last group of a pass (not row-read)

	mu       sync.Mutex
	cond     *sync.Cond
	fifo     []*slot // loaded or loading groups, oldest first
	next     int     // index into order of the next group the reader loads; -1 = wait for Acquire
	closed   bool
	stats    StreamStats
	acquired time.Time
	held     *slot
	wg       sync.WaitGroup
	sink     atomic.Uint32 // keeps page touches from being optimized away
}

// slot is one group's place in the window.
type slot struct {
	group     int
	off, size uint64
	views     [][]byte
	ready     bool
	err       error
}

// NewStreamer plans f's groups under opt.Budget, reads the pinned ones
// and, in pipelined mode, starts reading ahead. f must stay open until
// Close.
func NewStreamer(f *File, groups []Group, opt StreamOptions) (*Streamer, error) {
	if opt.ChunkBytes <= 0 {
		opt.ChunkBytes = defaultChunk
	}
	plan, err := PlanStream(f, groups, opt)
	if err != nil {
		return nil, err
	}
	if opt.Method == IOMmap {
		u, ok := f.closer.(unmapper)
		if !ok {
			return nil, fmt.Errorf("stream: %s is not mapped; the mmap method needs a File from Open", f.Path)
		}
		// Prefetch says exactly which ranges to read (MADV_WILLNEED); a
		// fault's readahead would pull in bytes beyond the window.
		adviseRandom(u.m)
	}
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	noReadahead(fh)
	s := &Streamer{f: f, fh: fh, groups: groups, plan: plan, opt: opt, next: -1}
	s.io = ioThrottle{t: opt.Throttle}
	s.cond = sync.NewCond(&s.mu)
	if err := s.checkFile(); err != nil {
		fh.Close()
		return nil, err
	}
	s.tensors = make([][]*Tensor, len(groups))
	s.stats = StreamStats{Mode: opt.Mode, Method: opt.Method, Budget: opt.Budget, Pinned: plan.PinBytes, Window: plan.Window}
	s.stats.Groups = make([]GroupStats, len(groups))
	for i, g := range groups {
		s.stats.Groups[i] = GroupStats{Name: g.Name, Pinned: plan.Pinned[i]}
		for _, name := range g.Tensors {
			t, _ := f.Tensor(name)
			s.tensors[i] = append(s.tensors[i], t)
			s.stats.Groups[i].Bytes += t.Size
		}
		if !plan.Pinned[i] && !g.Rows {
			s.order = append(s.order, i)
		}
		if !g.Rows {
			s.last = i
		}
	}
	if err := s.pin(); err != nil {
		s.Close()
		return nil, err
	}
	if opt.Method == IOPread && plan.Window > 0 {
		if s.ring, err = allocAnon(int(plan.Window)); err != nil {
			s.Close()
			return nil, fmt.Errorf("stream: window of %s: %w", progress.Bytes(plan.Window), err)
		}
	}
	s.addResident(plan.PinBytes)
	// Whatever parsing or loading touched through the mapping leaves now,
	// so only what this Streamer holds is resident.
	s.Evict()
	if opt.Mode == StreamPipelined && len(s.order) > 0 {
		s.next = 0
		s.wg.Add(1)
		go s.reader()
	}
	return s, nil
}

// Plan returns the plan the Streamer follows.
func (s *Streamer) Plan() StreamPlan { return s.plan }

// checkFile refuses a file whose size changed since it was parsed: the
// tensor offsets would point at other bytes or past the end.
func (s *Streamer) checkFile() error {
	st, err := s.fh.Stat()
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	if st.Size() != s.f.Size {
		return fmt.Errorf("stream: %s changed: it is %d bytes now, %d when opened; reopen the model", s.f.Path, st.Size(), s.f.Size)
	}
	return nil
}

// pin reads every pinned group into memory the Streamer owns (pread) or
// faults its pages in (mmap).
func (s *Streamer) pin() error {
	if s.plan.PinBytes == 0 {
		return nil
	}
	if s.opt.Method == IOPread {
		var err error
		if s.pinMem, err = allocAnon(int(s.plan.PinBytes)); err != nil {
			return fmt.Errorf("stream: pinned groups of %s: %w", progress.Bytes(s.plan.PinBytes), err)
		}
	}
	var off uint64
	for g := range s.groups {
		if !s.plan.Pinned[g] {
			continue
		}
		sl := &slot{group: g, off: off, size: s.stats.Groups[g].Bytes}
		if _, err := s.load(sl, s.pinMem); err != nil {
			return err
		}
		s.stats.WarmupRead += sl.size
		off += sl.size
		s.pinnedViews(g, sl.views)
	}
	return nil
}

func (s *Streamer) pinnedViews(g int, views [][]byte) {
	if s.pinned == nil {
		s.pinned = make([][][]byte, len(s.groups))
	}
	s.pinned[g] = views
}

// load brings one group's bytes into buf at sl.off (pread) or into the
// page cache under the mapping (mmap) and sets sl.views. It returns the
// time the reads took.
func (s *Streamer) load(sl *slot, buf []byte) (time.Duration, error) {
	start := time.Now()
	ts := s.tensors[sl.group]
	sl.views = make([][]byte, len(ts))
	if s.opt.Method == IOMmap {
		for i, t := range ts {
			if err := s.touch(t); err != nil {
				return time.Since(start), err
			}
			sl.views[i] = t.Data
		}
		return time.Since(start), nil
	}
	// Tensors that lie back to back in the file are read as one run, so
	// the requests are ChunkBytes long rather than a tensor each (a
	// layer's small attention matrices would otherwise be short reads).
	off := sl.off
	for i := 0; i < len(ts); {
		j, n := i+1, ts[i].Size
		for j < len(ts) && ts[j].Offset == ts[i].Offset+n {
			n += ts[j].Size
			j++
		}
		run := ts[i:j]
		covered := func(lo, hi uint64) string { // the tensors a failed read spans
			var names []string
			for _, t := range run {
				if t.Offset < hi && lo < t.Offset+t.Size {
					names = append(names, t.Name)
				}
			}
			return strings.Join(names, ", ")
		}
		if err := s.readAt(buf[off:off+n], ts[i].Offset, covered); err != nil {
			return time.Since(start), err
		}
		for k := i; k < j; k++ {
			sl.views[k] = buf[off : off+ts[k].Size : off+ts[k].Size]
			off += ts[k].Size
		}
		i = j
	}
	return time.Since(start), nil
}

// readAt fills p from the file at off in chunks, throttled, dropping the
// page cache behind each chunk; an error names what covered gives for the
// failed chunk's bytes [lo, hi).
func (s *Streamer) readAt(p []byte, off uint64, covered func(lo, hi uint64) string) error {
	chunk := s.opt.ChunkBytes
	for done := 0; done < len(p); {
		n := min(chunk, len(p)-done)
		due := s.io.reserve(n)
		got, err := readFile(s.fh, p[done:done+n], int64(off)+int64(done))
		dropCache(s.fh, int64(off)+int64(done), int64(n))
		sleepUntil(due)
		if err != nil || got != n {
			if err := s.checkFile(); err != nil {
				return err
			}
			at := off + uint64(done)
			return fmt.Errorf("stream: %s: read %s at offset %d: %w", s.f.Path, covered(at, at+uint64(n)), at, errOr(err, "short read"))
		}
		done += n
	}
	return nil
}

// readFile is the Streamer's one read call; tests swap it to inject IO
// errors.
var readFile = func(fh *os.File, p []byte, off int64) (int, error) { return fh.ReadAt(p, off) }

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

// touch faults a mapped tensor's pages in, throttled, turning a fault on
// a shrunken file into an error instead of SIGBUS.
func (s *Streamer) touch(t *Tensor) (err error) {
	if err := s.checkFile(); err != nil {
		return err
	}
	adviseWillNeed(t.Data)
	chunk := s.opt.ChunkBytes
	for done := 0; done < len(t.Data); {
		n := min(chunk, len(t.Data)-done)
		due := s.io.reserve(n)
		sum, err := touchPages(t.Data[done : done+n])
		if err != nil {
			return fmt.Errorf("stream: %s: tensor %s: %w", s.f.Path, t.Name, err)
		}
		s.sink.Add(uint32(sum))
		sleepUntil(due)
		done += n
	}
	return nil
}

// Acquire returns the data of group g's tensors (in Group.Tensors order),
// waiting for them to be read if needed. The views stay valid until
// Release(g). Groups should be acquired in compute order, one at a time;
// out of order works but discards what was read ahead.
func (s *Streamer) Acquire(g int) ([][]byte, error) {
	if g < 0 || g >= len(s.groups) {
		return nil, fmt.Errorf("stream: group %d of %d", g, len(s.groups))
	}
	if s.plan.Pinned[g] {
		s.mu.Lock()
		s.acquired = time.Now()
		s.mu.Unlock()
		return s.pinned[g], nil
	}
	if s.groups[g].Rows {
		return nil, fmt.Errorf("stream: group %s is read by rows (ReadTensorAt), not acquired", s.groups[g].Name)
	}
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("stream: streamer is closed")
	}
	if s.held != nil {
		return nil, fmt.Errorf("stream: acquire %s while %s is held", s.groups[g].Name, s.groups[s.held.group].Name)
	}
	var sl *slot
	if s.opt.Mode == StreamStd {
		// Read now, into the start of the window.
		s.mu.Unlock()
		sl = &slot{group: g, size: s.stats.Groups[g].Bytes}
		s.io.restart() // the device idled while the last group computed
		d, err := s.load(sl, s.ring)
		s.mu.Lock()
		s.account(sl, d, err)
		if err != nil {
			return nil, err
		}
		s.addResidentLocked(sl.size)
	} else {
		for {
			if s.closed {
				return nil, errors.New("stream: streamer is closed")
			}
			if len(s.fifo) > 0 && s.fifo[0].group == g {
				if sl = s.fifo[0]; sl.ready {
					break
				}
			} else if len(s.fifo) > 0 || s.next < 0 || s.order[s.next] != g {
				// Out of order (a pass was cut short by an error):
				// start over from g.
				s.restartLocked(g)
			}
			s.cond.Wait()
		}
		if sl.err != nil {
			err := sl.err
			// The reader stopped at the failure; the next pass restarts.
			s.restartLocked(-1)
			return nil, err
		}
	}
	wait := time.Since(start)
	s.stats.Stall += wait
	s.stats.Groups[g].Stall += wait
	s.held = sl
	s.acquired = time.Now()
	return sl.views, nil
}

// Ready reports whether Acquire(g) would return without waiting for a
// read: g is pinned or already in the window.
func (s *Streamer) Ready(g int) bool {
	if g < 0 || g >= len(s.groups) || s.plan.Pinned[g] {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fifo) > 0 && s.fifo[0].group == g && s.fifo[0].ready
}

// Release ends the use of group g's views; a streamed group's bytes are
// freed for the reader (and dropped from memory with the mmap method).
func (s *Streamer) Release(g int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g >= 0 && g < len(s.groups) && !s.acquired.IsZero() {
		s.stats.Groups[g].Compute += time.Since(s.acquired)
		s.acquired = time.Time{}
	}
	if g == s.last {
		s.stats.Passes++
	}
	sl := s.held
	if sl == nil || sl.group != g {
		return
	}
	s.held = nil
	s.dropLocked(sl)
	if s.opt.Mode == StreamPipelined && len(s.fifo) > 0 && s.fifo[0] == sl {
		s.fifo = s.fifo[1:]
		s.cond.Broadcast()
	}
}

// dropLocked frees a slot's bytes.
func (s *Streamer) dropLocked(sl *slot) {
	if s.opt.Method == IOMmap {
		for _, t := range s.tensors[sl.group] {
			releaseMapped(s.fh, t)
		}
	}
	s.stats.Resident -= sl.size
}

// restartLocked waits out the reader's current read, drops everything in
// the window and points the reader at group g (-1: at whichever group
// the next Acquire asks for).
func (s *Streamer) restartLocked(g int) {
	s.next = -1 // stop the reader from taking more
	for len(s.fifo) > 0 && !s.fifo[len(s.fifo)-1].ready {
		s.cond.Wait()
	}
	for _, sl := range s.fifo {
		if sl.err == nil {
			s.dropLocked(sl)
		}
	}
	s.fifo = nil
	if g >= 0 {
		for i, o := range s.order {
			if o == g {
				s.next = i
			}
		}
	}
	s.cond.Broadcast()
}

// reader streams groups into the window in compute order, wrapping
// around, as long as there is room and nothing failed.
func (s *Streamer) reader() {
	defer s.wg.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var sl *slot
		waited := false
		for !s.closed {
			if s.next >= 0 && (len(s.fifo) == 0 || s.fifo[len(s.fifo)-1].err == nil) {
				g := s.order[s.next]
				if off, ok := s.placeLocked(s.stats.Groups[g].Bytes); ok {
					sl = &slot{group: g, off: off, size: s.stats.Groups[g].Bytes}
					break
				}
			}
			s.cond.Wait()
			waited = true
		}
		if waited {
			s.io.restart() // the device idled while the window was full
		}
		if s.closed {
			return
		}
		s.fifo = append(s.fifo, sl)
		s.addResidentLocked(sl.size)
		s.next = (s.next + 1) % len(s.order)
		s.mu.Unlock()
		d, err := s.load(sl, s.ring)
		s.mu.Lock()
		s.account(sl, d, err)
		if err != nil {
			s.stats.Resident -= sl.size
			sl.err = err
		}
		sl.ready = true
		s.cond.Broadcast()
	}
}

func (s *Streamer) account(sl *slot, d time.Duration, err error) {
	s.stats.ReadTime += d
	s.stats.Groups[sl.group].ReadTime += d
	if err == nil {
		s.stats.BytesRead += sl.size
		s.stats.Groups[sl.group].Reads++
	}
}

// placeLocked finds room for n contiguous bytes in the window after the
// newest slot, wrapping to the start when the end is too short.
func (s *Streamer) placeLocked(n uint64) (uint64, bool) {
	w := s.plan.Window
	if len(s.fifo) == 0 {
		return 0, n <= w
	}
	first, last := s.fifo[0], s.fifo[len(s.fifo)-1]
	end := last.off + last.size
	if last.off >= first.off { // not wrapped: free is [end, w) and [0, first.off)
		if end+n <= w {
			return end, true
		}
		return 0, n <= first.off
	}
	return end, end+n <= first.off
}

func (s *Streamer) addResident(n uint64) {
	s.mu.Lock()
	s.addResidentLocked(n)
	s.mu.Unlock()
}

func (s *Streamer) addResidentLocked(n uint64) {
	s.stats.Resident += n
	s.stats.Peak = max(s.stats.Peak, s.stats.Resident)
}

// Pinned returns the views of group g when it is pinned.
func (s *Streamer) Pinned(g int) ([][]byte, bool) {
	if g < 0 || g >= len(s.groups) || !s.plan.Pinned[g] {
		return nil, false
	}
	return s.pinned[g], true
}

// ReadTensorAt reads len(p) bytes of tensor name starting off bytes into
// its data, directly from the file (for embedding rows, which are a few
// KB of a large tensor). The bytes count as read.
func (s *Streamer) ReadTensorAt(name string, p []byte, off uint64) error {
	t, ok := s.f.Tensor(name)
	if !ok {
		return fmt.Errorf("stream: tensor %q is missing", name)
	}
	if off+uint64(len(p)) > t.Size {
		return fmt.Errorf("stream: %s: bytes %d..%d are outside the tensor's %d", name, off, off+uint64(len(p)), t.Size)
	}
	if err := s.readAt(p, t.Offset+off, func(_, _ uint64) string { return name }); err != nil {
		return err
	}
	s.mu.Lock()
	s.stats.BytesRead += uint64(len(p))
	s.mu.Unlock()
	return nil
}

// Evict drops every page of the file that is not pinned from this
// process and from the page cache. The cache is dropped for the whole
// file, not tensor by tensor: readahead through a mapping caches large
// folios that straddle tensor boundaries, and the kernel only drops a
// folio whose every page lies in the range asked. Pinned pages of the
// mmap method are mapped, so the kernel keeps them.
func (s *Streamer) Evict() {
	for i := range s.f.Tensors {
		t := &s.f.Tensors[i]
		if s.opt.Method == IOMmap && s.isPinned(t.Name) {
			continue
		}
		unmapPages(t.Data)
	}
	dropCache(s.fh, 0, s.f.Size)
}

func (s *Streamer) isPinned(name string) bool {
	for g, ts := range s.tensors {
		for _, t := range ts {
			if t.Name == name {
				return s.plan.Pinned[g]
			}
		}
	}
	return false
}

// Stats returns a copy of the counters.
func (s *Streamer) Stats() StreamStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Groups = append([]GroupStats(nil), s.stats.Groups...)
	for _, sl := range s.fifo {
		if sl.ready && sl.err == nil && sl != s.held {
			st.Ahead += sl.size
		}
	}
	return st
}

// Close stops the reader and frees the window and pinned memory. Views
// from Acquire are invalid afterwards.
func (s *Streamer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
	if s.opt.Method == IOMmap {
		s.Evict()
	}
	freeAnon(s.ring)
	freeAnon(s.pinMem)
	s.ring, s.pinMem = nil, nil
	return s.fh.Close()
}

// ioThrottle paces reads to a bandwidth, as a device that transfers at
// that rate while a request is outstanding. Reads in a run (the next chunk,
// the next group, with no wait for room between them) keep the device's
// schedule: a reader that wakes late from its sleep (a millisecond, or
// tens on a busy machine, against 10 ms per 4 MiB chunk at 400 MB/s) does
// not idle the device, and the chunks after it catch up, by at most
// throttleMaxLag so a long stall is not followed by a burst faster than
// the device. A read after a wait (compute in Std mode, a full window in
// StdPL) restarts the schedule from now: idle time is not banked.
type ioThrottle struct {
	t    Throttle
	mu   sync.Mutex
	next time.Time // when the device finishes what it was given; zero: idle
}

// reserve books n bytes on the emulated device and returns when they
// would be done; the real read happens meanwhile.
func (io *ioThrottle) reserve(n int) time.Time {
	if io.t.Bandwidth <= 0 && io.t.Latency <= 0 {
		return time.Time{}
	}
	io.mu.Lock()
	defer io.mu.Unlock()
	start := io.next
	if now := time.Now(); start.IsZero() {
		start = now
	} else if lag := now.Sub(start); lag > throttleMaxLag {
		start = now.Add(-throttleMaxLag)
	}
	done := start.Add(io.t.Latency)
	if io.t.Bandwidth > 0 {
		done = done.Add(time.Duration(float64(n) / io.t.Bandwidth * float64(time.Second)))
	}
	io.next = done
	return done
}

const throttleMaxLag = 25 * time.Millisecond

// restart marks the device idle since its last request: the next read is
// scheduled from the time it is made.
func (io *ioThrottle) restart() {
	io.mu.Lock()
	io.next = time.Time{}
	io.mu.Unlock()
}

func sleepUntil(t time.Time) {
	if !t.IsZero() {
		time.Sleep(time.Until(t))
	}
}
