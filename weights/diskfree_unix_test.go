//go:build unix

package weights

import "testing"

func TestDiskFreeReads(t *testing.T) {
	free, ok := diskFree(t.TempDir())
	if !ok || free == 0 {
		t.Errorf("diskFree of a temporary directory: %d, %v; want the space left", free, ok)
	}
	if _, ok := diskFree("/no/such/dir"); ok {
		t.Error("diskFree of a missing directory reported space")
	}
}
