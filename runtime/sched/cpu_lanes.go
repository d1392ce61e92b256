package sched

import (
	"errors"
	"fmt"

	"github.com/tandem-llm/tandem/runtime/model"
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
}

// CPULanes loads one model per lane from f (the mapping is shared), each
// with its own kernel pool and KV cache, named cpu0, cpu1, ... The
// returned function closes the models; f stays open and is the caller's.
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
		name := fmt.Sprintf("cpu%d", i)
		e, err := NewModelEngine(m, ModelEngineOptions{Name: name, MaxSeqs: opt.MaxSeqs, Context: opt.Context, KVType: opt.KVType})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		lanes = append(lanes, Lane{Name: name, Engine: e})
	}
	return lanes, closeAll, nil
}
