// Package budget resolves a weight budget as users write it, for lanes
// that each load the same model file: "" keeps the whole file mapped; a
// size like "512MiB" is the memory all lanes together hold, "auto" a
// share of the memory available, split the same way; "25%" is a share
// of the weights each lane holds, and "min" the smallest each lane's
// model allows. tandem serve and the mobile binding share it.
package budget

import (
	"fmt"
	"strings"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// Options say how "auto" reads the machine and whether the model can
// stream at all.
type Options struct {
	// AutoShare is the share of available memory "auto" takes, leaving
	// the rest to the KV caches, the process and the rest of the device.
	AutoShare float64
	// Available reports the available memory (sysmem.Available; a test
	// seam).
	Available func() (uint64, error)
	// Embedded says the model is built into the binary: it has no file
	// to stream from, so only "" and "auto" (which then keeps it whole)
	// are accepted.
	Embedded bool
}

// Plan is what a budget resolved to.
type Plan struct {
	// Stream is each lane's streaming options; nil keeps the whole file
	// mapped (resident).
	Stream *weights.StreamOptions
	// Note says how the budget was chosen, for logs and stats.
	Note string
}

// Check reports a budget that no model file can take: one that does not
// parse, or any but "" and "auto" for the embedded model. It reads no
// file, so a command checks its flags before it loads anything (tandem
// serve, before it listens); ForLanes says the rest.
func Check(budget string, embedded bool) error {
	_, err := Parse(budget, embedded)
	return err
}

// Form is a budget as written: Kind is "" (none), "min", "auto", "%" (a
// share of the weights, Share percent each lane) or "size" (Size bytes
// all lanes together).
type Form struct {
	Kind  string
	Share float64
	Size  uint64
}

// Parse reads a budget as written, without a model: what it refuses, no
// model takes (tandem generate resolves its one lane's budget from it).
// The embedded model has no file to stream from, so it takes only "" and
// "auto"; a budget that would not parse for any model says what is wrong
// with it first.
func Parse(budget string, embedded bool) (Form, error) {
	f, err := parse(budget)
	if err == nil && embedded && f.Kind != "" && f.Kind != "auto" {
		return Form{}, fmt.Errorf("budget %q: the embedded default model has no file to stream from; give a model file, or no budget, or auto", budget)
	}
	return f, err
}

// parse is Parse for a model file. Sizes are read as written: an error
// quotes "-5MiB", not its lowercase.
func parse(budget string) (Form, error) {
	t := strings.TrimSpace(budget)
	b := strings.ToLower(t)
	switch {
	case b == "" || b == "auto" || b == "min":
		return Form{Kind: b}, nil
	case strings.HasSuffix(b, "%"):
		v, err := units.ParsePercent(b)
		if err != nil {
			return Form{}, fmt.Errorf("budget %s: want a share of the weights above 0%% and at most 100%%, like 25%%", budget)
		}
		return Form{Kind: "%", Share: v}, nil
	}
	n, err := units.ParseSize(t)
	if err != nil {
		return Form{}, fmt.Errorf("budget: %w (or N%% of the weights, auto, or min)", err)
	}
	if n == 0 {
		return Form{}, fmt.Errorf("budget %s holds no weights: give a size like 512MiB, a share like 25%%, auto or min, or no budget to keep the model resident", budget)
	}
	return Form{Kind: "size", Size: n}, nil
}

// ForLanes resolves budget for lanes lanes over f. Each lane streams its
// own copy of the weights through its share of the budget.
func ForLanes(f *weights.File, budget string, lanes int, opt Options) (Plan, error) {
	fm, err := Parse(budget, opt.Embedded)
	switch {
	case err != nil:
		return Plan{}, err
	case fm.Kind == "":
		return Plan{Note: "resident (no budget)"}, nil
	case lanes < 1:
		return Plan{}, fmt.Errorf("budget %q for %d lanes: want at least one", budget, lanes)
	case opt.Embedded: // auto: Parse refused the rest
		return Plan{Note: "resident (the embedded model is small and has no file to stream from)"}, nil
	}
	so := weights.StreamOptions{Mode: weights.StreamPipelined, Method: weights.IOPread}
	// The plan at budget 0 fails but reports the total and the minimum.
	probe, _, err := model.PlanStream(f, so)
	if err != nil && probe.Min == 0 {
		return Plan{}, err
	}
	var total uint64
	note := strings.TrimSpace(budget)
	switch fm.Kind {
	case "min":
		total = probe.Min * uint64(lanes)
	case "auto":
		avail, err := opt.Available()
		if err != nil {
			return Plan{}, fmt.Errorf("budget auto: reading available memory: %w; give a size like 512MiB instead", err)
		}
		total = uint64(float64(avail) * opt.AutoShare)
		note = fmt.Sprintf("auto: %.0f%% of %s available", 100*opt.AutoShare, progress.Bytes(avail))
		if total/uint64(lanes) >= probe.Total {
			return Plan{Note: note + "; the whole model fits, resident"}, nil
		}
	case "%":
		total = uint64(float64(probe.Total) * fm.Share / 100 * float64(lanes))
	default:
		total = fm.Size
	}
	so.Budget = total / uint64(lanes)
	if so.Budget < probe.Min {
		return Plan{}, fmt.Errorf("budget %s leaves %s per lane for %d lane(s); %s needs at least %s per lane: use fewer lanes, a larger budget, or min",
			note, progress.Bytes(so.Budget), lanes, f.Path, progress.Bytes(probe.Min))
	}
	if _, _, err := model.PlanStream(f, so); err != nil {
		return Plan{}, fmt.Errorf("budget %s: %w", note, err)
	}
	if so.Budget >= probe.Total {
		note += fmt.Sprintf("; the whole model, %s, fits and stays pinned", progress.Bytes(probe.Total))
	}
	return Plan{Stream: &so, Note: fmt.Sprintf("streamed, %s per lane (%s)", progress.Bytes(so.Budget), note)}, nil
}
