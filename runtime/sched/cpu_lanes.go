package sched

import (
	"errors"
	"fmt"

	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// CPULaneOptions configures CPULanes.
type CPULaneOptions struct {
	// Threads is the kernel threads of each lane, one entry per lane; the
	// first lane is the primary, later ones take long requests.
	Threads []int
	// MaxSeqs, Context and KVType configure each lane's ModelEngine (see
	// ModelEngineOptions).
	MaxSeqs int
	Context int
	KVType  weights.DType
	// Stream, when set, streams each lane's weights under Stream.Budget
	// (each lane holds its own budget); nil computes on the mapped file.
	Stream *weights.StreamOptions
	// Draft, when set, makes every lane speculative: the draft is loaded
	// per lane on the lane's kernel pool (draft and target take turns on
	// it) and the lane runs a SpecEngine with Spec (Pipeline must be off).
	// The caller checks first that the tokenizers match (spec.CheckVocab).
	Draft *weights.File
	Spec  spec.Config
}

// CPULanes loads one model per lane from f (the mapping is shared), each
// with its own kernel pool and KV cache, named cpu0, cpu1, ... (spec0,
// spec1, ... with a draft). The returned function closes the models; f
// and the draft stay open and are the caller's.
func CPULanes(f *weights.File, opt CPULaneOptions) ([]Lane, func() error, error) {
	if len(opt.Threads) == 0 {
		return nil, nil, errors.New("sched: cpu lanes: no lanes; give the threads of at least one")
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
	for i, th := range opt.Threads {
		mopt := model.Options{Threads: th}
		if opt.Stream != nil {
			// Each model owns its streamer; a copy keeps them apart.
			s := *opt.Stream
			mopt.Stream = &s
		}
		m, err := model.Load(f, mopt)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("sched: lane cpu%d: %w", i, err)
		}
		models = append(models, m)
		if opt.Draft == nil {
			name := fmt.Sprintf("cpu%d", i)
			e, err := NewModelEngine(m, ModelEngineOptions{Name: name, MaxSeqs: opt.MaxSeqs, Context: opt.Context, KVType: opt.KVType})
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			lanes = append(lanes, Lane{Name: name, Engine: e})
			continue
		}
		dm, err := model.Load(opt.Draft, model.Options{Pool: m.Pool()})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("sched: lane spec%d: draft: %w", i, err)
		}
		// The draft shares the target's pool: closed before the target.
		models = append([]*model.Model{dm}, models...)
		name := fmt.Sprintf("spec%d", i)
		e, err := NewSpecEngine(dm, m, opt.Spec, SpecEngineOptions{Name: name, MaxSeqs: opt.MaxSeqs, Context: opt.Context, KVType: opt.KVType})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		lanes = append(lanes, Lane{Name: name, Engine: e})
	}
	return lanes, closeAll, nil
}
