//go:build !linux

package weights

import (
	"errors"
	"os"
)

// Without madvise/fadvise/mincore the Streamer still bounds the memory
// it holds (pread into its own buffers); it cannot evict the OS cache.

func allocAnon(n int) ([]byte, error)  { return make([]byte, n), nil }
func freeAnon([]byte)                  {}
func dropCache(*os.File, int64, int64) {}
func noReadahead(*os.File)             {}
func adviseWillNeed([]byte)            {}
func adviseRandom([]byte)              {} // readahead stays the OS's own
func adviseNormal([]byte)              {}
func releaseMapped(*os.File, *Tensor)  {}
func unmapPages([]byte)                {}

func touchPages(b []byte) (sum byte, err error) {
	for i := 0; i < len(b); i += 4096 {
		sum += b[i]
	}
	return sum, nil
}

// ResidentPages needs mincore(2), which this platform lacks.
func ResidentPages(b []byte) (resident, total int, err error) {
	return 0, 0, errors.New("mincore is not available on this platform")
}

// DropPageCache needs posix_fadvise, which this platform lacks.
func DropPageCache(path string) error {
	return errors.New("dropping the page cache is not available on this platform")
}
