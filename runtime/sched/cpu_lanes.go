package sched

import (
	"errors"
	"fmt"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// LaneSpec is one lane LoadLanes makes.
type LaneSpec struct {
	// Device is where the lane's model computes (model.Options.Device):
	// "" or "cpu" for the CPU kernels, "cuda" or "cuda:N" for GPU N. A
	// binary built without -tags cuda refuses a GPU lane with the model's
	// error saying to rebuild.
	Device string
	// Threads sizes the lane's kernel pool. A CPU lane computes on it (0
	// lets the kernels choose, or one per CPU of CPUs); a GPU lane
	// computes on the device, and 0 gives it one thread for the little
	// host work it has.
	Threads int
	// CPUs pins a CPU lane's threads, its goroutine included, to these
	// CPUs: cpuset.Named("big") or ("little") on a phone, so that the
	// lanes compute on the cores they are measured on. Nil lets the
	// kernel place them.
	CPUs cpuset.Set
}

// GPU reports whether the lane computes on a GPU (a misnamed device is
// not one: loading the lane says what is wrong with it).
func (l LaneSpec) GPU() bool {
	gpu, _, err := model.ParseDevice(l.Device)
	return gpu && err == nil
}

// MaxLaneThreads bounds a lane's threads, written or implied by its CPUs
// (a thread per CPU): more is a typo, not a machine.
const MaxLaneThreads = kernels.MaxThreads

// ThreadCount is the threads the lane runs: Threads, or for a pinned CPU
// lane without a count, one per CPU (0 still lets the kernels choose for
// a lane the OS places).
func (l LaneSpec) ThreadCount() int {
	if l.Threads == 0 && l.CPUs != nil && !l.GPU() {
		return len(l.CPUs)
	}
	return l.Threads
}

// Check reports what makes the spec one no lane can run: a negative
// thread count or one above MaxLaneThreads (written, or one per CPU), a
// GPU lane pinned to CPUs, or more threads than CPUs (they would take
// turns). LoadLanes, --lanes and the mobile config all ask it before
// anything loads.
func (l LaneSpec) Check() error {
	n := l.ThreadCount()
	switch {
	case l.Threads < 0:
		return fmt.Errorf("%d threads; want 0 or more", l.Threads)
	case n > MaxLaneThreads && l.Threads == 0:
		return fmt.Errorf("%d threads, one per CPU of %s; a lane takes at most %d, so give a thread count", n, l.CPUs, MaxLaneThreads)
	case n > MaxLaneThreads:
		return fmt.Errorf("%d threads; a lane takes at most %d", n, MaxLaneThreads)
	case l.CPUs != nil && l.GPU():
		return errors.New("a GPU lane is not pinned to CPUs; pin CPU lanes only")
	case l.CPUs != nil && n > len(l.CPUs):
		return fmt.Errorf("%d threads on %d CPUs (%s) would take turns on them; give at most %d threads, or more CPUs", n, len(l.CPUs), l.CPUs, len(l.CPUs))
	}
	return nil
}

// String is the lane as --lanes writes it: 4, 2@4-7, cuda or cuda:1.
func (l LaneSpec) String() string {
	if l.Device != "" && l.Device != "cpu" {
		return l.Device
	}
	if l.CPUs != nil {
		return fmt.Sprintf("%d@%s", l.Threads, l.CPUs)
	}
	return fmt.Sprint(l.Threads)
}

// CPULaneSpecs are CPU lanes of the given threads each.
func CPULaneSpecs(threads ...int) []LaneSpec {
	out := make([]LaneSpec, len(threads))
	for i, th := range threads {
		out[i] = LaneSpec{Threads: th}
	}
	return out
}

// LaneOptions configures LoadLanes.
type LaneOptions struct {
	// Lanes has one entry per lane: the first lane is the primary, later
	// ones take long requests (so a GPU lane first and a CPU lane after
	// it offloads long requests to the CPU).
	Lanes []LaneSpec
	// MaxSeqs, Context and KVType configure each lane's ModelEngine (see
	// ModelEngineOptions).
	MaxSeqs int
	Context int
	KVType  weights.DType
	// NoPrefixReuse turns off each lane's prefix reuse (see ModelEngine
	// and SpecEngine).
	NoPrefixReuse bool
	// PrefixCache is each lane's ModelEngineOptions.PrefixCache.
	PrefixCache int64
	// Stream, when set, streams each lane's weights under Stream.Budget
	// (each lane holds its own budget of host RAM; a GPU lane streams
	// them on to the device, see model.Options.Stream); nil computes on
	// the mapped file, or on a resident copy on the GPU.
	Stream *weights.StreamOptions
	// Draft, when set, makes every lane speculative: the draft is loaded
	// per lane, on the lane's device and kernel pool (draft and target take
	// turns on it), and the lane runs a SpecEngine with Spec. The caller
	// checks first that the tokenizers match (spec.CheckVocab). With
	// Spec.Pipeline and Stream, each lane gets its own spec.Lane (Spec.Lane
	// is ignored), so its draft computes while its target waits for
	// weights; without Stream the pipeline is off.
	Draft *weights.File
	Spec  spec.Config
	// DraftContext caps each draft's KV positions per sequence (see
	// SpecEngineOptions.DraftContext).
	DraftContext int
}

// LoadLanes loads one model per lane from f (the mapping is shared),
// each with its own kernel pool and KV cache (on the GPU for a GPU lane),
// named by kind and position in Lanes: cpu0, cuda1, ... (spec0, cudaspec1,
// ... with a draft). The returned function closes the models; f and the
// draft stay open and are the caller's.
func LoadLanes(f *weights.File, opt LaneOptions) ([]Lane, func() error, error) {
	if len(opt.Lanes) == 0 {
		return nil, nil, errors.New("sched: lanes: no lanes; give at least one (threads for a CPU lane, or a GPU)")
	}
	var lanes []Lane
	var models []*model.Model
	closeAll := func() error {
		var errs []error
		for _, m := range models {
			errs = append(errs, m.Close())
		}
		return errors.Join(errs...)
	}
	for i, ls := range opt.Lanes {
		kind := "cpu"
		if ls.GPU() {
			kind = "cuda"
		}
		name := fmt.Sprintf("%s%d", kind, i)
		if err := ls.Check(); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("sched: lane %s: %w", name, err)
		}
		mopt := model.Options{Threads: ls.ThreadCount(), Device: ls.Device, CPUs: ls.CPUs}
		if ls.GPU() && mopt.Threads == 0 {
			mopt.Threads = 1
		}
		if opt.Stream != nil {
			// Each model owns its streamer; a copy keeps them apart.
			s := *opt.Stream
			mopt.Stream = &s
		}
		scfg := opt.Spec
		scfg.Lane = nil
		if opt.Draft != nil && opt.Stream != nil && scfg.Pipeline {
			// The target lets go of the lane while it waits on IO, and
			// this lane's draft computes in those gaps.
			scfg.Lane = spec.NewLane()
			mopt.Lane = scfg.Lane
		} else {
			scfg.Pipeline = false
		}
		m, err := model.Load(f, mopt)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("sched: lane %s: %w", name, err)
		}
		models = append(models, m)
		if opt.Draft == nil {
			e, err := NewModelEngine(m, ModelEngineOptions{Name: name, MaxSeqs: opt.MaxSeqs, Context: opt.Context, KVType: opt.KVType,
				NoPrefixReuse: opt.NoPrefixReuse, PrefixCache: opt.PrefixCache})
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			lanes = append(lanes, Lane{Name: name, Engine: e})
			continue
		}
		name = fmt.Sprintf("spec%d", i)
		if ls.GPU() {
			name = fmt.Sprintf("cudaspec%d", i)
		}
		dm, err := model.Load(opt.Draft, model.Options{Pool: m.Pool(), Device: ls.Device})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("sched: lane %s: draft: %w", name, err)
		}
		// The draft shares the target's pool: closed before the target.
		models = append([]*model.Model{dm}, models...)
		e, err := NewSpecEngine(dm, m, scfg, SpecEngineOptions{Name: name, MaxSeqs: opt.MaxSeqs, Context: opt.Context, DraftContext: opt.DraftContext, KVType: opt.KVType,
			NoPrefixReuse: opt.NoPrefixReuse, PrefixCache: opt.PrefixCache})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		lanes = append(lanes, Lane{Name: name, Engine: e})
	}
	return lanes, closeAll, nil
}
