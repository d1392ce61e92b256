//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"gorgonia.org/cu"
)

// Stream orders one user's work on a device: kernels on a compute
// stream, host-to-device copies on an upload stream and device-to-host
// copies on a download stream, with events so each copy waits for the
// work it depends on and no longer. One model owns one Stream; a Stream is
// not safe for concurrent use.
//
// A failed launch or copy leaves the stream failed: later calls return
// the same error (Err) without touching the device, so a caller may check
// once after a sequence of calls.
type Stream struct {
	d                 *Device
	compute, up, down cu.Stream
	upDone, compDone  cu.Event
	upStage, downStg  *Pinned
	err               error

	scratch Buffer // activation quants and attention scores, grown
	gen     int    // counts scratch reallocations (graphs record its address)

	capturing bool
	// quantOf is the activation buffer whose int8 blocks are at the
	// start of scratch; any other launch or copy clears it.
	quantOf Buffer
	args    []uint64
	ptrs    []unsafe.Pointer
}

// NewStream makes a Stream on d.
func (d *Device) NewStream() (*Stream, error) {
	s := &Stream{d: d}
	defer d.bind()()
	var err error
	for _, st := range []*cu.Stream{&s.compute, &s.up, &s.down} {
		if *st, err = cu.MakeStream(cu.NonBlocking); err != nil {
			s.Close()
			return nil, fmt.Errorf("cuda: GPU %d: making a stream: %w", d.Ordinal, err)
		}
	}
	for _, ev := range []*cu.Event{&s.upDone, &s.compDone} {
		if *ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			s.Close()
			return nil, fmt.Errorf("cuda: GPU %d: making an event: %w", d.Ordinal, err)
		}
	}
	return s, nil
}

var errCapturing = errors.New("cuda: copies and synchronization cannot be recorded in a graph capture")

// Generation changes whenever the stream's scratch memory moves, which
// invalidates Graphs recorded before.
func (s *Stream) Generation() int { return s.gen }

// Device is the GPU the stream runs on.
func (s *Stream) Device() *Device { return s.d }

// Err is the stream's first launch or copy failure.
func (s *Stream) Err() error { return s.err }

func (s *Stream) fail(err error) error {
	if s.err == nil && err != nil {
		s.err = err
	}
	return s.err
}

// Sync waits for all of the stream's work.
func (s *Stream) Sync() error {
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	defer s.d.bind()()
	for _, st := range []cu.Stream{s.up, s.compute, s.down} {
		if err := st.Synchronize(); err != nil {
			return s.fail(fmt.Errorf("cuda: GPU %d: synchronize: %w", s.d.Ordinal, err))
		}
	}
	return nil
}

// Close waits for the stream's work and releases it.
func (s *Stream) Close() error {
	if s.d == nil {
		return ErrClosed
	}
	errs := []error{s.Sync()}
	if errors.Is(errs[0], s.err) {
		errs[0] = nil // reported before; release anyway
	}
	unbind := s.d.bind()
	for _, st := range []*cu.Stream{&s.compute, &s.up, &s.down} {
		if *st != (cu.Stream{}) {
			errs = append(errs, st.Destroy())
		}
	}
	for _, ev := range []*cu.Event{&s.upDone, &s.compDone} {
		if *ev != (cu.Event{}) {
			errs = append(errs, cu.DestroyEvent(ev))
		}
	}
	unbind()
	errs = append(errs, s.upStage.Free(), s.downStg.Free(), s.d.Free(s.scratch))
	s.d = nil
	return errors.Join(errs...)
}

// stage returns pinned memory of at least n bytes, replacing *p when too
// small. The previous contents are not kept.
func (s *Stream) stage(p **Pinned, n int) ([]byte, error) {
	if *p == nil || len((*p).Bytes) < n {
		if err := (*p).Free(); err != nil {
			return nil, err
		}
		*p = nil
		np, err := s.d.AllocPinned(max(n, 64<<10))
		if err != nil {
			return nil, err
		}
		*p = np
	}
	return (*p).Bytes[:n], nil
}

// Upload copies src to the start of dst. The copy runs on the upload
// stream after all compute work queued so far (which may still read dst)
// and before any compute work queued after it; the call returns once src
// is staged, without waiting for the copy.
func (s *Stream) Upload(dst Buffer, src []byte) error {
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	if int64(len(src)) > dst.size {
		return fmt.Errorf("cuda: upload of %d bytes into a %d-byte buffer", len(src), dst.size)
	}
	if len(src) == 0 {
		return nil
	}
	defer s.d.bind()()
	// The staging memory is reused: the previous upload must be done.
	if err := s.upDone.Synchronize(); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: waiting for an upload: %w", s.d.Ordinal, err))
	}
	buf, err := s.stage(&s.upStage, len(src))
	if err != nil {
		return s.fail(err)
	}
	copy(buf, src)
	s.quantOf = Buffer{}
	if err := s.order(s.compute, s.compDone, s.up); err != nil {
		return err
	}
	if err := cu.MemcpyHtoDAsync(dst.ptr, unsafe.Pointer(&buf[0]), int64(len(src)), s.up); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: upload of %d bytes: %w", s.d.Ordinal, len(src), err))
	}
	return s.order(s.up, s.upDone, s.compute)
}

// Download copies the start of src into dst once the compute work queued
// so far is done, and waits for it.
func (s *Stream) Download(dst []byte, src Buffer) error {
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	if int64(len(dst)) > src.size {
		return fmt.Errorf("cuda: download of %d bytes from a %d-byte buffer", len(dst), src.size)
	}
	if len(dst) == 0 {
		return nil
	}
	defer s.d.bind()()
	buf, err := s.stage(&s.downStg, len(dst))
	if err != nil {
		return s.fail(err)
	}
	if err := s.order(s.compute, s.compDone, s.down); err != nil {
		return err
	}
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), src.ptr, int64(len(dst)), s.down); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: download of %d bytes: %w", s.d.Ordinal, len(dst), err))
	}
	if err := s.down.Synchronize(); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: download of %d bytes: %w", s.d.Ordinal, len(dst), err))
	}
	copy(dst, buf)
	return nil
}

// order makes work queued on next from now on wait for the work queued
// on prev so far, through ev.
func (s *Stream) order(prev cu.Stream, ev cu.Event, next cu.Stream) error {
	if err := ev.Record(prev); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: recording an event: %w", s.d.Ordinal, err))
	}
	if err := next.Wait(ev, 0); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: waiting on an event: %w", s.d.Ordinal, err))
	}
	return nil
}

// Copy copies src into dst on the device, in order with the compute work
// (used to measure the device's memory bandwidth).
func (s *Stream) Copy(dst, src Buffer) error {
	if s.err != nil {
		return s.err
	}
	if src.size > dst.size {
		return fmt.Errorf("cuda: copy of %d bytes into a %d-byte buffer", src.size, dst.size)
	}
	s.quantOf = Buffer{}
	defer s.d.bind()()
	if err := cu.MemcpyDtoDAsync(dst.ptr, src.ptr, src.size, s.compute); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: device copy of %d bytes: %w", s.d.Ordinal, src.size, err))
	}
	return nil
}

// UploadFloat32 and the other typed uploads copy a Go slice's bytes.
func (s *Stream) UploadFloat32(dst Buffer, src []float32) error { return s.Upload(dst, bytesOf(src)) }

// UploadInt32 copies int32 values.
func (s *Stream) UploadInt32(dst Buffer, src []int32) error { return s.Upload(dst, bytesOf(src)) }

// DownloadFloat32 copies float32 values back.
func (s *Stream) DownloadFloat32(dst []float32, src Buffer) error {
	return s.Download(bytesOf(dst), src)
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// scratchBuf returns device scratch of at least n bytes for the next
// kernel. Growing it waits for the work that used the old one.
func (s *Stream) scratchBuf(n int64) (Buffer, error) {
	if s.scratch.size >= n {
		return s.scratch.Slice(0, n), nil
	}
	if s.capturing {
		return Buffer{}, s.fail(fmt.Errorf("cuda: scratch of %d bytes needed during a capture (have %d): Reserve it first", n, s.scratch.size))
	}
	s.gen++
	s.quantOf = Buffer{}
	if err := s.Sync(); err != nil {
		return Buffer{}, err
	}
	size := max(n, 2*s.scratch.size, 1<<20)
	if err := s.d.Free(s.scratch); err != nil {
		return Buffer{}, s.fail(err)
	}
	s.scratch = Buffer{}
	b, err := s.d.Alloc(size)
	if err != nil {
		return Buffer{}, err
	}
	s.scratch = b
	return b.Slice(0, n), nil
}

// launch runs kernel fn on the compute stream. Arguments are Buffers
// (device pointers), ints and int32s (C int), int64s (long long) and
// float32s: each is passed in a 64-bit slot whose low bytes hold the value,
// which is how gorgonia.org/cu's Launch copies them (little-endian).
func (s *Stream) launch(fn string, grid [3]int, block, shared int, args ...any) error {
	if !strings.HasPrefix(fn, "matmul_") {
		s.quantOf = Buffer{}
	}
	return s.launchOn(s.compute, fn, grid, block, shared, args...)
}

// launchOn is launch on queue st: the compute stream, or the upload
// stream for a kernel that only rearranges uploaded bytes (repack_q).
func (s *Stream) launchOn(st cu.Stream, fn string, grid [3]int, block, shared int, args ...any) error {
	if s.err != nil {
		return s.err
	}
	f, ok := s.d.fns[fn]
	if !ok {
		return s.fail(fmt.Errorf("cuda: kernel %s is not loaded", fn))
	}
	s.args = s.args[:0]
	for i, a := range args {
		var v uint64
		switch a := a.(type) {
		case Buffer:
			v = uint64(a.ptr)
		case int:
			if a < math.MinInt32 || a > math.MaxInt32 {
				return fmt.Errorf("cuda: %s argument %d: %d does not fit a C int", fn, i, a)
			}
			v = uint64(uint32(int32(a)))
		case int32:
			v = uint64(uint32(a))
		case int64:
			v = uint64(a)
		case float32:
			v = uint64(math.Float32bits(a))
		case bool:
			if a {
				v = 1
			}
		default:
			return s.fail(fmt.Errorf("cuda: %s argument %d has type %T", fn, i, a))
		}
		s.args = append(s.args, v)
	}
	s.ptrs = s.ptrs[:0]
	for i := range s.args {
		s.ptrs = append(s.ptrs, unsafe.Pointer(&s.args[i]))
	}
	for _, g := range grid {
		if g <= 0 || g > math.MaxInt32 {
			return fmt.Errorf("cuda: %s: grid %v out of range", fn, grid)
		}
	}
	defer s.d.bind()()
	if err := f.Launch(grid[0], grid[1], grid[2], block, 1, 1, shared, st, s.ptrs); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: launching %s (grid %v, block %d): %w", s.d.Ordinal, fn, grid, block, err))
	}
	return nil
}

func blocks(n, per int) int { return (n + per - 1) / per }
