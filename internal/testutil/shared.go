// Package testutil finds the shared real models and reference vectors that
// tests read in place (they are never copied into the project).
package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// SharedDir returns the ../shared folder beside the repository (or
// $TANDEM_SHARED). When it is absent the test is skipped, unless
// TANDEM_REQUIRE_SHARED=1 (as CI sets it), in which case it fails.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("TANDEM_SHARED")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "..", "shared")
	}
	if _, err := os.Stat(filepath.Join(dir, "models")); err != nil {
		if os.Getenv("TANDEM_REQUIRE_SHARED") == "1" {
			t.Fatalf("shared models not found at %s (TANDEM_REQUIRE_SHARED=1): %v", dir, err)
		}
		t.Skipf("shared models not found at %s; set TANDEM_SHARED or put shared/ beside the repo", dir)
	}
	return dir
}

// Model returns the path of a file in ../shared/models.
func Model(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(SharedDir(t), "models", name)
}

// ModelCopy copies a file of ../shared/models into the test's temporary
// directory, for tests that change it (truncate it under a running
// model), and returns the copy's path and the original bytes.
func ModelCopy(t testing.TB, name string) (string, []byte) {
	t.Helper()
	data, err := os.ReadFile(Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// Testdata returns the path of a file in ../shared/testdata.
func Testdata(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(SharedDir(t), "testdata", name)
}

// RepoRoot walks up from the working directory to the folder holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}
