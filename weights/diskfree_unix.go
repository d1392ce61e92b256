//go:build unix

package weights

import "golang.org/x/sys/unix"

// diskFree is the space an unprivileged user may still write in dir's
// file system, or false where it cannot be read.
func diskFree(dir string) (uint64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
