//go:build unix

package weights

import (
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestOpenRefusesAPipe: a named pipe given as a model or a llama2.c
// tokenizer is refused at once; opening it to read blocked until a writer
// came, which was never.
func TestOpenRefusesAPipe(t *testing.T) {
	testutil.RefusesAPipe(t, func(path string) error { _, err := Open(path); return err })
	testutil.RefusesAPipe(t, func(path string) error { _, err := OpenLlama2CTokenizer(path); return err })
}
