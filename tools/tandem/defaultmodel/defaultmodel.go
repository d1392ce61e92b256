// Package defaultmodel embeds tandem's own model pair, trained by
// `make models` (README, "Training"): a target and a draft that share
// one vocabulary, so generate, serve, bench and the mobile facade show
// speculative decoding with no files and no network. The target's
// uncertainty calibration comes with it, so the scheduler predicts
// answer lengths from the first request.
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
	//go:embed target.calib.json
	targetCalibration []byte
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

// Calibration is the embedded target's uncertainty calibration, as
// tandem calibrate wrote it (make models), for sched.ParseCalibration. As
// bytes: the runtime's own tests use this package, so it imports none of
// the runtime beyond weights.
func Calibration() []byte { return targetCalibration }

// CalibrationName is how Calibration's source is named to users.
const CalibrationName = "the embedded default calibration"

// IsEmbedded reports whether f is one of the embedded models.
func IsEmbedded(f *weights.File) bool {
	return f != nil && (f.Path == TargetName || f.Path == DraftName)
}
