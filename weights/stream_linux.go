//go:build linux

package weights

import (
	"fmt"
	"os"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

var pageSize = uintptr(unix.Getpagesize())

// allocAnon maps n bytes of anonymous memory: outside the Go heap (the
// garbage collector neither scans nor keeps it) and returned to the
// system exactly on freeAnon.
func allocAnon(n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
}

func freeAnon(b []byte) {
	if b != nil {
		unix.Munmap(b)
	}
}

// pageRange widens b to whole pages, as madvise and mincore require.
func pageRange(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	// Mappings start on a page, so the widened range stays inside b's.
	p := unsafe.Pointer(unsafe.SliceData(b))
	head := uintptr(p) & (pageSize - 1)
	n := (head + uintptr(len(b)) + pageSize - 1) &^ (pageSize - 1)
	return unsafe.Slice((*byte)(unsafe.Add(p, -int(head))), int(n))
}

// dropCache asks the kernel to drop the file's cached pages under [off,
// off+n), widened to whole pages (a partial page is otherwise kept):
// clean pages of a read-only model go at once.
func dropCache(fh *os.File, off, n int64) {
	ps := int64(pageSize)
	lo := off &^ (ps - 1)
	hi := (off + n + ps - 1) &^ (ps - 1)
	unix.Fadvise(int(fh.Fd()), lo, hi-lo, unix.FADV_DONTNEED)
}

// DropPageCache asks the kernel to drop every cached page of the file at
// path that no process maps, so the next read comes from storage:
// benchmarks of streaming start cold with it.
func DropPageCache(path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	if err := unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop page cache of %s: %w", path, err)
	}
	return nil
}

// noReadahead turns off the kernel's readahead for fh: the Streamer
// reads in large chunks itself, and pages read ahead of a chunk (or
// around an embedding row) would sit in the page cache uncounted.
func noReadahead(fh *os.File) {
	unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_RANDOM)
}

func adviseWillNeed(b []byte) {
	if r := pageRange(b); r != nil {
		unix.Madvise(r, unix.MADV_WILLNEED)
	}
}

// releaseMapped unmaps a tensor's pages from this process and drops them
// from the page cache. Pages shared with a neighbouring tensor go too;
// if that one is still in use it faults them back in.
func releaseMapped(fh *os.File, t *Tensor) {
	unmapPages(t.Data)
	dropCache(fh, int64(t.Offset), int64(t.Size))
}

// unmapPages drops b's pages from this process's mapping (the page cache
// keeps them until dropCache).
func unmapPages(b []byte) {
	if r := pageRange(b); r != nil {
		unix.Madvise(r, unix.MADV_DONTNEED)
	}
}

// touchPages reads one byte per page so the pages are in memory before
// compute needs them. A fault (the file shrank under the mapping) comes
// back as an error rather than killing the process.
func touchPages(b []byte) (sum byte, err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault reading the mapped file (was it truncated?): %v", r)
		}
	}()
	for i := 0; i < len(b); i += int(pageSize) {
		sum += b[i]
	}
	if len(b) > 0 {
		sum += b[len(b)-1]
	}
	return sum, nil
}

// ResidentPages reports how many of the pages under b are in memory
// (mincore(2)), and how many pages b spans.
func ResidentPages(b []byte) (resident, total int, err error) {
	r := pageRange(b)
	if r == nil {
		return 0, 0, nil
	}
	vec := make([]byte, len(r)/int(pageSize))
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(r))), uintptr(len(r)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	if errno != 0 {
		return 0, 0, fmt.Errorf("mincore: %w", errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec), nil
}

// adviseRandom tells the kernel a mapping is read piecemeal, so a fault
// brings in its page rather than a readahead window (8 MiB on some
// disks): opening a model reads its header, not the weights behind it.
// adviseNormal restores readahead for computing on the mapping.
func adviseRandom(b []byte) { advise(b, unix.MADV_RANDOM) }
func adviseNormal(b []byte) { advise(b, unix.MADV_NORMAL) }

func advise(b []byte, how int) {
	if r := pageRange(b); r != nil {
		unix.Madvise(r, how)
	}
}
