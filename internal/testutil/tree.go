package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteTree writes files, named by slash paths relative to a new
// temporary directory, and returns the directory. Each body gets a
// trailing newline, as sysfs and procfs write theirs: tests build a
// machine's /sys (a phone's cores, a Jetson's clocks) this way.
func WriteTree(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
