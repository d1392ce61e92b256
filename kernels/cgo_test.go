//go:build cgo

package kernels

import (
	"fmt"
	"testing"
)

// testBackends lists every implementation: Go, then C at each
// instruction-set level this machine runs (e.g. c/1 = AVX2, c/0 = scalar C).
func testBackends() []string {
	names := []string{"go"}
	for _, l := range cLevels() {
		names = append(names, fmt.Sprintf("c/%d", l))
	}
	return names
}

func useBackend(t testing.TB, name string) (restore func()) {
	t.Helper()
	oldBackend, oldLevel := Backend(), cLevel
	if name != "go" {
		var l int
		if _, err := fmt.Sscanf(name, "c/%d", &l); err != nil {
			t.Fatalf("backend %q: %v", name, err)
		}
		cLevel = _Ctype_int(l)
		name = "c"
	}
	if err := SetBackend(name); err != nil {
		t.Fatal(err)
	}
	return func() {
		cLevel = oldLevel
		SetBackend(oldBackend)
	}
}
