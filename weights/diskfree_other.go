//go:build !unix

package weights

// diskFree cannot read free space here: writes fail when the disk fills.
func diskFree(string) (uint64, bool) { return 0, false }
