//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/aarch64-linux-gnu/tegra
#include <cuda.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	// Starts the driver before gorgonia.org/cu can exit the process.
	_ "github.com/tandem-llm/tandem/kernels/cuda/internal/cuinit"
)

// ErrClosed is returned by a Device or Stream used after Close.
var ErrClosed = errors.New("cuda: closed")

// Device is one GPU with tandem's kernels loaded into its primary
// context. Open shares one Device per GPU within the process; it is safe
// for concurrent use, and each user orders its work on its own Stream.
type Device struct {
	Ordinal      int
	Name         string
	Major, Minor int   // compute capability
	Arch         int   // the PTX architecture loaded (see Archs)
	SMs          int   // multiprocessors
	Memory       int64 // bytes of device memory

	dev  cu.Device
	ctx  cu.CUContext
	mods []cu.Module
	fns  map[string]cu.Function
	refs int
}

var (
	openMu sync.Mutex
	opened = map[int]*Device{}
)

// Open returns GPU ordinal (0 is the first), loading the kernels on first
// use. Each Open needs a Close.
func Open(ordinal int) (*Device, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if d := opened[ordinal]; d != nil {
		d.refs++
		return d, nil
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("cuda: counting GPUs: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: GPU %d does not exist: this machine has %d (numbered from 0)", ordinal, n)
	}
	d := &Device{Ordinal: ordinal, dev: cu.Device(ordinal), fns: map[string]cu.Function{}, refs: 1}
	if err := d.open(); err != nil {
		d.release()
		return nil, err
	}
	opened[ordinal] = d
	return d, nil
}

func (d *Device) open() error {
	var err error
	if d.Name, err = d.dev.Name(); err != nil {
		return fmt.Errorf("cuda: GPU %d: name: %w", d.Ordinal, err)
	}
	for _, a := range []struct {
		dst  *int
		attr cu.DeviceAttribute
	}{
		{&d.Major, cu.ComputeCapabilityMajor},
		{&d.Minor, cu.ComputeCapabilityMinor},
		{&d.SMs, cu.MultiprocessorCount},
	} {
		if *a.dst, err = d.dev.Attribute(a.attr); err != nil {
			return fmt.Errorf("cuda: GPU %d (%s): attribute %v: %w", d.Ordinal, d.Name, a.attr, err)
		}
	}
	if d.Memory, err = d.dev.TotalMem(); err != nil {
		return fmt.Errorf("cuda: GPU %d (%s): memory size: %w", d.Ordinal, d.Name, err)
	}
	if d.Arch, err = ChooseArch(d.Major, d.Minor); err != nil {
		return fmt.Errorf("cuda: GPU %d (%s): %w", d.Ordinal, d.Name, err)
	}
	// The primary context is the one the CUDA runtime and other libraries
	// use too, so tandem can share a process with them.
	if d.ctx, err = d.dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("cuda: GPU %d (%s): context: %w", d.Ordinal, d.Name, err)
	}
	defer d.bind()()
	for _, m := range Modules {
		src, err := PTX(m, d.Arch)
		if err != nil {
			return err
		}
		mod, err := cu.LoadData(src)
		if err != nil {
			return fmt.Errorf("cuda: GPU %d (%s, sm_%d%d): loading the sm_%d PTX of %s.cu: %w "+
				"(a driver older than CUDA 11.8 rejects this PTX; on JetPack 4 regenerate it with that release's nvcc: make cuda-ptx NVCC=/usr/local/cuda/bin/nvcc)",
				d.Ordinal, d.Name, d.Major, d.Minor, d.Arch, m, err)
		}
		d.mods = append(d.mods, mod)
		for _, e := range Entries[m] {
			fn, err := mod.Function(e)
			if err != nil {
				return fmt.Errorf("cuda: kernel %s in %s.cu (sm_%d): %w", e, m, d.Arch, err)
			}
			d.fns[e] = fn
		}
	}
	return nil
}

// Close releases the GPU when its last user closes it.
func (d *Device) Close() error {
	openMu.Lock()
	defer openMu.Unlock()
	if d.refs <= 0 {
		return ErrClosed
	}
	if d.refs--; d.refs > 0 {
		return nil
	}
	delete(opened, d.Ordinal)
	return d.release()
}

func (d *Device) release() error {
	var errs []error
	if len(d.mods) > 0 {
		unbind := d.bind()
		for _, m := range d.mods {
			errs = append(errs, m.Unload())
		}
		unbind()
		d.mods = nil
	}
	if d.ctx != (cu.CUContext{}) {
		errs = append(errs, d.dev.ReleasePrimaryCtx())
		d.ctx = cu.CUContext{}
	}
	return errors.Join(errs...)
}

// String names the GPU: "NVIDIA H100 80GB HBM3 (GPU 0, sm_90, 132 SMs, 79.1 GiB)".
func (d *Device) String() string {
	return fmt.Sprintf("%s (GPU %d, sm_%d%d, %d SMs, %.1f GiB)", d.Name, d.Ordinal, d.Major, d.Minor, d.SMs, float64(d.Memory)/(1<<30))
}

// bind makes the device's context current on this goroutine's OS thread
// until the returned func runs: the driver API acts on the calling
// thread's context, and Go moves goroutines between threads.
func (d *Device) bind() func() {
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		// Only an invalid context fails here, which Open never hands out.
		panic(fmt.Sprintf("cuda: binding GPU %d's context: %v", d.Ordinal, err))
	}
	return runtime.UnlockOSThread
}

// MemInfo returns the free and total bytes of device memory.
func (d *Device) MemInfo() (free, total int64, err error) {
	defer d.bind()()
	return cu.MemInfo()
}

// Buffer is a range of device memory. The zero Buffer is empty.
type Buffer struct {
	ptr  cu.DevicePtr
	size int64
}

// Size is the buffer's length in bytes.
func (b Buffer) Size() int64 { return b.size }

// Ptr is the device address (for kernel arguments and tests).
func (b Buffer) Ptr() uintptr { return uintptr(b.ptr) }

// Slice returns bytes [off, off+n) of b.
func (b Buffer) Slice(off, n int64) Buffer {
	if off < 0 || n < 0 || off+n > b.size {
		panic(fmt.Sprintf("cuda: slice [%d, %d) of a %d-byte buffer", off, off+n, b.size))
	}
	return Buffer{ptr: b.ptr + cu.DevicePtr(off), size: n}
}

// Alloc allocates size bytes of device memory (plain cuMemAlloc, never
// managed memory).
func (d *Device) Alloc(size int64) (Buffer, error) {
	if size <= 0 {
		return Buffer{}, fmt.Errorf("cuda: allocating %d bytes: size must be positive", size)
	}
	defer d.bind()()
	p, err := cu.MemAlloc(size)
	if err != nil {
		free, total, _ := cu.MemInfo()
		return Buffer{}, fmt.Errorf("cuda: GPU %d: allocating %d bytes (%d of %d free): %w", d.Ordinal, size, free, total, err)
	}
	return Buffer{ptr: p, size: size}, nil
}

// Free releases a buffer from Alloc (a zero Buffer is ignored). Work
// that uses it must have finished (Stream.Sync).
func (d *Device) Free(b Buffer) error {
	if b.ptr == 0 {
		return nil
	}
	defer d.bind()()
	if err := cu.MemFree(b.ptr); err != nil {
		return fmt.Errorf("cuda: GPU %d: free: %w", d.Ordinal, err)
	}
	return nil
}

// Pinned is page-locked host memory: the GPU copies it asynchronously and
// at full link speed, where pageable memory is first staged by the driver.
type Pinned struct {
	d *Device
	p unsafe.Pointer
	// Bytes is the memory, valid until Free.
	Bytes []byte
}

// AllocPinned allocates n bytes of pinned host memory.
func (d *Device) AllocPinned(n int) (*Pinned, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: pinning %d bytes: size must be positive", n)
	}
	defer d.bind()()
	var p unsafe.Pointer
	// gorgonia.org/cu has no cuMemHostAlloc, hence this one cgo call.
	if r := C.cuMemHostAlloc(&p, C.size_t(n), C.CU_MEMHOSTALLOC_PORTABLE); r != C.CUDA_SUCCESS {
		return nil, fmt.Errorf("cuda: pinning %d bytes of host memory: CUresult %d", n, int(r))
	}
	return &Pinned{d: d, p: p, Bytes: unsafe.Slice((*byte)(p), n)}, nil
}

// Free releases pinned memory; copies from or to it must have finished.
func (p *Pinned) Free() error {
	if p == nil || p.p == nil {
		return nil
	}
	defer p.d.bind()()
	err := cu.MemFreeHost(p.p)
	p.p, p.Bytes = nil, nil
	if err != nil {
		return fmt.Errorf("cuda: freeing pinned memory: %w", err)
	}
	return nil
}
