//go:build unix

package tokenizer

import (
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestLoadRefusesAPipe: a named pipe given as --tokenizer hung, and a
// piped /dev/stdin read as "0 bytes" (the magic's read had taken them).
func TestLoadRefusesAPipe(t *testing.T) {
	testutil.RefusesAPipe(t, func(path string) error { _, err := Load(path); return err })
}
