//go:build !cgo

package kernels

import "testing"

func testBackends() []string { return []string{"go"} }

func useBackend(t testing.TB, name string) (restore func()) {
	t.Helper()
	if err := SetBackend(name); err != nil {
		t.Fatal(err)
	}
	return func() {}
}
