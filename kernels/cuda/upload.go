//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/tandem-llm/tandem/weights"
)

// Event marks a point in one of a Stream's queues: another queue or the
// host then waits for the work queued before it, and for no more. A
// never-recorded Event is complete.
type Event struct {
	d  *Device
	ev cu.Event
}

// NewEvent makes an Event on the stream's device; Close releases it.
func (s *Stream) NewEvent() (*Event, error) {
	defer s.d.bind()()
	ev, err := cu.MakeEvent(cu.DisableTiming)
	if err != nil {
		return nil, fmt.Errorf("cuda: GPU %d: making an event: %w", s.d.Ordinal, err)
	}
	return &Event{d: s.d, ev: ev}, nil
}

// Close releases the event; work that waits on it must have been queued.
func (e *Event) Close() error {
	if e == nil || e.ev == (cu.Event{}) {
		return nil
	}
	defer e.d.bind()()
	err := cu.DestroyEvent(&e.ev)
	e.ev = cu.Event{}
	return err
}

// RecordCompute records e after the compute work queued so far.
func (s *Stream) RecordCompute(e *Event) error { return s.record(e, s.compute) }

// ComputeWait makes the compute work queued from now on wait for e.
func (s *Stream) ComputeWait(e *Event) error { return s.wait(s.compute, e) }

// SyncEvent blocks the host until the work queued before e is done.
func (s *Stream) SyncEvent(e *Event) error {
	if s.err != nil {
		return s.err
	}
	defer s.d.bind()()
	if err := e.ev.Synchronize(); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: waiting for an event: %w", s.d.Ordinal, err))
	}
	return nil
}

func (s *Stream) record(e *Event, on cu.Stream) error {
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	defer s.d.bind()()
	if err := e.ev.Record(on); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: recording an event: %w", s.d.Ordinal, err))
	}
	return nil
}

func (s *Stream) wait(on cu.Stream, e *Event) error {
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	defer s.d.bind()()
	if err := on.Wait(e.ev, 0); err != nil {
		return s.fail(fmt.Errorf("cuda: GPU %d: waiting on an event: %w", s.d.Ordinal, err))
	}
	return nil
}

// Uploader copies weight matrices into device buffers on a Stream's
// upload queue while its compute queue works, for weights streamed from
// storage a group at a time. A matrix goes in chunks through a small ring
// of pinned host buffers, so the host fills one chunk while the GPU copies
// the one before, and the pinned memory stays a few chunks however large
// the matrix (Stream.Upload stages a whole transfer). Q8_0 and Q4_0 bytes
// land in device scratch the caller gives and are repacked into the
// destination (the layout UploadWeights makes) by a kernel on the upload
// queue, so compute never waits for it.
//
// Calls return once the bytes are out of the caller's memory, before the
// device has them: Record an Event and have the compute queue wait on it
// (ComputeWait) before reading the destination. Failures fail the Stream.
// Use it from the goroutine that uses its Stream; Close it first.
type Uploader struct {
	s      *Stream
	stage  []*Pinned
	staged []*Event // stage[i]'s copy to the device is done
	next   int
	after  *Event // the next write into a destination waits for it
}

// NewUploader makes an Uploader on s with chunks pinned buffers of
// chunkBytes each (at least two chunks, so filling and copying overlap).
func (s *Stream) NewUploader(chunks, chunkBytes int) (*Uploader, error) {
	if chunks < 2 || chunkBytes <= 0 {
		return nil, fmt.Errorf("cuda: uploader: %d chunks of %d bytes; want at least 2 of a positive size", chunks, chunkBytes)
	}
	u := &Uploader{s: s}
	for range chunks {
		p, err := s.d.AllocPinned(chunkBytes)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("cuda: uploader staging: %w", err)
		}
		u.stage = append(u.stage, p)
		ev, err := s.NewEvent()
		if err != nil {
			u.Close()
			return nil, err
		}
		u.staged = append(u.staged, ev)
	}
	return u, nil
}

// PinnedBytes is the host memory the Uploader holds.
func (u *Uploader) PinnedBytes() int64 {
	var n int64
	for _, p := range u.stage {
		n += int64(len(p.Bytes))
	}
	return n
}

// WaitBefore makes the next write into a destination buffer (the first
// chunk of a plain matrix, the repack of a quantized one) wait for e:
// the compute that last read the memory being overwritten. Copies into
// the scratch ahead of it proceed meanwhile.
func (u *Uploader) WaitBefore(e *Event) { u.after = e }

func (u *Uploader) waitPending() error {
	e := u.after
	if e == nil {
		return nil
	}
	u.after = nil
	return u.s.wait(u.s.up, e)
}

// Weights queues a copy of a matrix of rows rows of cols weights of type
// wt, raw in GGUF layout, into dst in the layout the kernels read (as
// UploadWeights does). Q8_0 and Q4_0 bytes go through scratch, device
// memory of at least len(raw) bytes that nothing else uses until the
// upload queue is done with it (the next Weights call may reuse it: the
// queue runs in order); other types ignore it. It returns once raw may be
// reused.
func (u *Uploader) Weights(dst, scratch Buffer, raw []byte, wt weights.DType, rows, cols int) error {
	s := u.s
	if s.err != nil {
		return s.err
	}
	if s.capturing {
		return s.fail(errCapturing)
	}
	rb, err := wt.RowBytes(uint64(cols))
	if err != nil {
		return fmt.Errorf("cuda: weights: %w", err)
	}
	if uint64(len(raw)) != rb*uint64(rows) || int64(len(raw)) > dst.size {
		return fmt.Errorf("cuda: weights: %d bytes for %d rows of %d %s (%d expected) into a %d-byte buffer", len(raw), rows, cols, wt, rb*uint64(rows), dst.size)
	}
	quant := wt == weights.Q8_0 || wt == weights.Q4_0
	to := dst
	if quant {
		if int64(len(raw)) > scratch.size {
			return fmt.Errorf("cuda: weights: %d bytes of %s need as much scratch to repack; have %d", len(raw), wt, scratch.size)
		}
		to = scratch
	} else if err := u.waitPending(); err != nil {
		return err
	}
	defer s.d.bind()()
	for off := 0; off < len(raw); {
		i := u.next
		u.next = (u.next + 1) % len(u.stage)
		buf := u.stage[i].Bytes
		n := min(len(buf), len(raw)-off)
		// The chunk is refilled once its last copy is done.
		if err := u.staged[i].ev.Synchronize(); err != nil {
			return s.fail(fmt.Errorf("cuda: GPU %d: waiting for an upload: %w", s.d.Ordinal, err))
		}
		copy(buf[:n], raw[off:off+n])
		if err := cu.MemcpyHtoDAsync(to.ptr+cu.DevicePtr(off), unsafe.Pointer(&buf[0]), int64(n), s.up); err != nil {
			return s.fail(fmt.Errorf("cuda: GPU %d: upload of %d bytes: %w", s.d.Ordinal, n, err))
		}
		if err := u.staged[i].ev.Record(s.up); err != nil {
			return s.fail(fmt.Errorf("cuda: GPU %d: recording an event: %w", s.d.Ordinal, err))
		}
		off += n
	}
	if !quant {
		return nil
	}
	if err := u.waitPending(); err != nil {
		return err
	}
	nblocks := int64(len(raw) / wt.TypeSize())
	return s.launchOn(s.up, "repack_q", [3]int{blocks(int(nblocks), 256), 1, 1}, 256, 0, dst, scratch, nblocks, wt.TypeSize())
}

// Record records e after the upload work queued so far.
func (u *Uploader) Record(e *Event) error { return u.s.record(e, u.s.up) }

// Close waits for the queued uploads and frees the staging memory and
// events (not the scratch, which is the caller's).
func (u *Uploader) Close() error {
	if u == nil || u.s == nil {
		return nil
	}
	var errs []error
	if u.s.d != nil {
		unbind := u.s.d.bind()
		if err := u.s.up.Synchronize(); err != nil {
			errs = append(errs, fmt.Errorf("cuda: GPU %d: waiting for uploads: %w", u.s.d.Ordinal, err))
		}
		unbind()
	}
	for _, p := range u.stage {
		errs = append(errs, p.Free())
	}
	for _, e := range u.staged {
		errs = append(errs, e.Close())
	}
	u.stage, u.staged, u.s = nil, nil, nil
	return errors.Join(errs...)
}
