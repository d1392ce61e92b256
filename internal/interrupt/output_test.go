package interrupt

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOutput: Commit puts the whole file under its path with os.Create's
// mode; Discard, a failed Commit and a Commit after a Discard leave the
// path as it was and no temporary file; nothing stays tracked.
func TestOutput(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.txt")
	leftovers := func() []string {
		tmps, _ := filepath.Glob(path + ".tmp*")
		return tmps
	}
	tracking := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(tracked)
	}

	o, err := CreateOutput(path)
	if err != nil {
		t.Fatal(err)
	}
	o.WriteString("whole")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the path exists before Commit (%v)", err)
	}
	if err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	o.Discard() // deferred in callers: nothing after a Commit
	if b, err := os.ReadFile(path); err != nil || string(b) != "whole" {
		t.Errorf("after Commit: %q, %v", b, err)
	}
	if fi, _ := os.Stat(path); fi == nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want -rw-r--r--", fi)
	}

	o, _ = CreateOutput(path)
	o.WriteString("half")
	o.Discard()
	if err := o.Commit(); err == nil {
		t.Error("Commit after Discard succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "whole" {
		t.Errorf("a discarded write changed the path: %q", b)
	}

	// A rename that fails (the path is now a folder) removes the file.
	os.Remove(path)
	os.Mkdir(path, 0o755)
	os.WriteFile(filepath.Join(path, "x"), nil, 0o644)
	o, _ = CreateOutput(path)
	if err := o.Commit(); err == nil {
		t.Error("Commit over a folder succeeded")
	}
	if tmps := leftovers(); len(tmps) != 0 || tracking() != 0 {
		t.Errorf("left %v, %d paths tracked", tmps, tracking())
	}
}
