// Package defaultmodel embeds tandem's own model pair, trained by
// `make models` (README, "Training"), so generate, serve, bench and the
// mobile facade run with no files and no network.
package defaultmodel

import (
	_ "embed"

	"github.com/tandem-llm/tandem/weights"
)

//go:embed default.gguf
var target []byte

// TargetName is the Path of the embedded target's weights.File; callers
// compare against it to tell the embedded model from a file (it has no
// file to stream from).
const TargetName = "embedded default model (random weights)"

// Target parses the embedded target. Each call returns a new File over
// the same read-only bytes.
func Target() (*weights.File, error) {
	return weights.Parse(target, TargetName)
}

// IsEmbedded reports whether f is one of the embedded models.
func IsEmbedded(f *weights.File) bool {
	return f != nil && f.Path == TargetName
}
