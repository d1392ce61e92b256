package sysmem

import "testing"

// TestAvailable: this machine reports some free memory, and no more than
// it has.
func TestAvailable(t *testing.T) {
	n, err := Available()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n > 1<<50 {
		t.Errorf("Available = %d bytes", n)
	}
}
