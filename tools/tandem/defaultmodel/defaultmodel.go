// Package defaultmodel embeds tandem's own model pair, trained by
// `make models` (README, "Training"): a target and a draft that share
// one vocabulary, so generate, serve, bench and the mobile facade show
// speculative decoding with no files and no network.
package defaultmodel

import (
	_ "embed"

	"github.com/tandem-llm/tandem/weights"
)

var (
	//go:embed target.gguf
	target []byte
	//go:embed draft.gguf
	draft []byte
)

// The Paths of the embedded models' weights.Files. Callers compare
// against them (IsEmbedded) to tell an embedded model from a file: it
// has no file to stream from.
const (
	TargetName = "embedded default target"
	DraftName  = "embedded default draft"
)

// Target parses the embedded target. Each call returns a new File over
// the same read-only bytes.
func Target() (*weights.File, error) { return weights.Parse(target, TargetName) }

// Draft parses the embedded draft, the target's speculative partner.
func Draft() (*weights.File, error) { return weights.Parse(draft, DraftName) }

// IsEmbedded reports whether f is one of the embedded models.
func IsEmbedded(f *weights.File) bool {
	return f != nil && (f.Path == TargetName || f.Path == DraftName)
}
