// Package model runs the LLaMA forward pass. Everything the engine
// computes (prefill, decode of several sequences, draft tree growth, tree
// verification) is one call, Forward, over a Batch of token slots.
package model

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// Options configures Load.
type Options struct {
	// Threads sizes the kernel pool Load makes when Pool is nil (0 lets
	// the kernels choose; at most kernels.MaxThreads).
	Threads int
	// Pool, when set, is shared with other models (the draft and the
	// target of a pair run on one pool); the Model does not close it.
	Pool *kernels.Pool
	// Stream, when set, keeps only Stream.Budget bytes of weights
	// resident and streams the rest from the file layer by layer (see
	// weights.Streamer). Nil computes on the whole mapped file. On a GPU
	// the budget is still host RAM: the device holds the pinned groups
	// plus two slots of the largest streamed group (ops_cuda.go).
	Stream *weights.StreamOptions
	// Lane, when set, is held by Forward while it computes and let go
	// while it waits for streamed weights, so that another model sharing
	// the cores (the draft of a speculative pair) computes only in this
	// model's IO gaps and the two never compete for a core.
	Lane sync.Locker
	// Device is where the model computes: "" or "cpu" for the CPU
	// kernels, "cuda" or "cuda:N" for GPU N, which holds the weights,
	// activations and the KV rows of caches made by NewCache (binaries
	// built with -tags cuda; others return an error).
	Device string
	// CPUs, when set, pins the threads of the pool Load makes to these
	// CPUs (a phone's big or little cores; kernels.NewPinnedPool). The
	// goroutine that calls Forward pins itself: the scheduler's lane
	// goroutine does, from sched.EngineInfo.CPUs.
	CPUs cpuset.Set
}

// matrix is a weight matrix of rows × cols as stored in the file: row r is
// the r-th contiguous run of cols elements.
type matrix struct {
	name       string
	data       []byte
	typ        weights.DType
	rows, cols int
}

type layer struct {
	attnNorm, ffnNorm []float32
	wq, wk, wv, wo    matrix
	gate, down, up    matrix
}

// Model is a loaded LLaMA model. Its weights are views into the file,
// which must stay open while the model is used. A Model is not safe for
// concurrent Forward calls: its activation buffers are reused.
type Model struct {
	cfg     Config
	file    *weights.File
	pool    *kernels.Pool
	ownPool bool

	embd    matrix // token_embd: Vocab rows of Dim
	layers  []layer
	outNorm []float32
	output  matrix // output head: Vocab rows of Dim (token_embd when tied)

	buf  buffers
	lane sync.Locker
	ops  ops // the backend the forward recipe computes on

	// stream is set when weights stream under a budget: group i < Layers
	// is layer i, then the output head, then (untied) the embedding.
	stream   *weights.Streamer
	embGroup int // group holding token_embd
	embIndex int // its index in the group
}

// Load checks f's hyperparameters against its tensors and prepares the
// model. Norm weights are converted to float32; matrices stay in the file.
func Load(f *weights.File, opt Options) (*Model, error) {
	if opt.Threads < 0 || opt.Threads > kernels.MaxThreads {
		// 100000 started as many spinning workers.
		return nil, fmt.Errorf("model: %d threads: want 0 (the kernels choose) to %d", opt.Threads, kernels.MaxThreads)
	}
	cfg, err := ConfigFrom(f)
	if err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg, file: f, lane: opt.Lane}
	if m.embd, err = loadMatrix(f, "token_embd.weight", cfg.Dim, cfg.Vocab); err != nil {
		return nil, err
	}
	kvd := cfg.KVDim()
	m.layers = make([]layer, cfg.Layers)
	for i := range m.layers {
		l := &m.layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		if l.attnNorm, err = loadVector(f, p+"attn_norm.weight", cfg.Dim); err != nil {
			return nil, err
		}
		if l.ffnNorm, err = loadVector(f, p+"ffn_norm.weight", cfg.Dim); err != nil {
			return nil, err
		}
		for _, w := range []struct {
			dst        *matrix
			name       string
			cols, rows int
		}{
			{&l.wq, "attn_q", cfg.Dim, cfg.Dim},
			{&l.wk, "attn_k", cfg.Dim, kvd},
			{&l.wv, "attn_v", cfg.Dim, kvd},
			{&l.wo, "attn_output", cfg.Dim, cfg.Dim},
			{&l.gate, "ffn_gate", cfg.Dim, cfg.Hidden},
			{&l.down, "ffn_down", cfg.Hidden, cfg.Dim},
			{&l.up, "ffn_up", cfg.Dim, cfg.Hidden},
		} {
			if *w.dst, err = loadMatrix(f, p+w.name+".weight", w.cols, w.rows); err != nil {
				return nil, err
			}
		}
	}
	if m.outNorm, err = loadVector(f, "output_norm.weight", cfg.Dim); err != nil {
		return nil, err
	}
	if cfg.Tied {
		m.output = m.embd
	} else if m.output, err = loadMatrix(f, "output.weight", cfg.Dim, cfg.Vocab); err != nil {
		return nil, err
	}
	if opt.Stream != nil {
		groups := streamGroups(cfg)
		if m.stream, err = weights.NewStreamer(f, groups, *opt.Stream); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		m.embGroup, m.embIndex = len(groups)-1, 0
	}
	if opt.Pool != nil {
		m.pool = opt.Pool
	} else if opt.CPUs != nil {
		if m.pool, err = kernels.NewPinnedPool(opt.Threads, opt.CPUs); err != nil {
			m.Close()
			return nil, fmt.Errorf("model: %w", err)
		}
		m.ownPool = true
	} else {
		m.pool = kernels.NewPool(opt.Threads)
		m.ownPool = true
	}
	if m.ops, err = newOps(m, opt.Device); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Config returns the model's hyperparameters.
func (m *Model) Config() Config { return m.cfg }

// File returns the weights file the model views.
func (m *Model) File() *weights.File { return m.file }

// Pool returns the kernel pool the model computes on.
func (m *Model) Pool() *kernels.Pool { return m.pool }

// Close releases the kernel pool if Load made it. It does not close the
// file, which the caller opened.
func (m *Model) Close() error {
	var errs []error
	if m.ops != nil {
		errs = append(errs, m.ops.close())
		m.ops = nil
	}
	if m.ownPool && m.pool != nil {
		m.pool.Close()
		m.pool = nil
	}
	if m.stream != nil {
		errs = append(errs, m.stream.Close())
		m.stream = nil
	}
	return errors.Join(errs...)
}

// streamGroups are the units weights stream in, in compute order: each
// layer's seven matrices, then the output head (token_embd when tied),
// then for an untied model the embedding, read by rows.
func streamGroups(cfg Config) []weights.Group {
	groups := make([]weights.Group, 0, cfg.Layers+2)
	for i := 0; i < cfg.Layers; i++ {
		g := weights.Group{Name: fmt.Sprintf("blk.%d", i)}
		for _, n := range layerMatrices {
			g.Tensors = append(g.Tensors, fmt.Sprintf("blk.%d.%s.weight", i, n))
		}
		groups = append(groups, g)
	}
	if cfg.Tied {
		return append(groups, weights.Group{Name: "output", Tensors: []string{"token_embd.weight"}})
	}
	return append(groups,
		weights.Group{Name: "output", Tensors: []string{"output.weight"}},
		weights.Group{Name: "token_embd", Tensors: []string{"token_embd.weight"}, Rows: true})
}

// layerMatrices are a layer's matrices in the order Acquire returns them.
var layerMatrices = [...]string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up"}

// PlanStream says what opt.Budget buys for the model in f: which layers
// stay pinned, the streaming window, and the smallest budget that works.
func PlanStream(f *weights.File, opt weights.StreamOptions) (weights.StreamPlan, []weights.Group, error) {
	cfg, err := ConfigFrom(f)
	if err != nil {
		return weights.StreamPlan{}, nil, err
	}
	groups := streamGroups(cfg)
	p, err := weights.PlanStream(f, groups, opt)
	return p, groups, err
}

// Streamed reports whether the model's weights stream under a budget
// (Forward then waits on IO, and a Lane lets another model use the gaps).
func (m *Model) Streamed() bool { return m.stream != nil }

// StreamStats returns the streamer's counters; ok is false when the
// model computes on the whole mapped file.
func (m *Model) StreamStats() (st weights.StreamStats, ok bool) {
	if m.stream == nil {
		return st, false
	}
	return m.stream.Stats(), true
}

// NewCache makes a KV cache shaped for this model. context 0 means the
// model's own context length; a larger one is refused because positions
// past the trained context are refused anyway.
func (m *Model) NewCache(context int, typ weights.DType) (*kv.Cache, error) {
	return m.NewTreeCache(context, 0, typ)
}

// NewTreeCache is NewCache with tree more rows per sequence past the
// context for tentative rows (kv.Config.Tree): a speculative decoder's
// token tree (spec.Config.TreeRows) then keeps its full size up to the
// last position.
func (m *Model) NewTreeCache(context, tree int, typ weights.DType) (*kv.Cache, error) {
	if context == 0 {
		context = m.cfg.Context
	}
	if context < 0 || context > m.cfg.Context {
		return nil, fmt.Errorf("model: cache context %d is outside 1..%d (the model's context length)", context, m.cfg.Context)
	}
	return m.ops.newCache(kv.Config{Layers: m.cfg.Layers, KVDim: m.cfg.KVDim(), Context: context, Tree: tree, Type: typ})
}

// loadMatrix checks a tensor's shape (GGML order [cols, rows]), type and
// byte size and returns its view.
func loadMatrix(f *weights.File, name string, cols, rows int) (matrix, error) {
	t, err := f.TensorShaped(name, uint64(cols), uint64(rows))
	if err != nil {
		return matrix{}, fmt.Errorf("model: %w", err)
	}
	if !t.Type.Computable() {
		return matrix{}, fmt.Errorf("%s: tensor %s has type %v, which tandem has no kernel for; use a file quantized to one it computes (%s), as llama.cpp's llama-quantize makes from the original weights",
			f.Path, name, t.Type, strings.Join(weights.ComputableTypes(), ", "))
	}
	rowBytes, err := t.Type.RowBytes(uint64(cols))
	if err != nil {
		return matrix{}, fmt.Errorf("%s: tensor %s: %w", f.Path, name, err)
	}
	want := rowBytes * uint64(rows)
	if t.Data == nil {
		return matrix{}, fmt.Errorf("%s: tensor %s has no mapped data; open the file with weights.Open (mapped) to run it", f.Path, name)
	}
	if uint64(len(t.Data)) != want {
		return matrix{}, fmt.Errorf("%s: tensor %s holds %d bytes, want %d for %d rows of %d %v", f.Path, name, len(t.Data), want, rows, cols, t.Type)
	}
	return matrix{name: name, data: t.Data, typ: t.Type, rows: rows, cols: cols}, nil
}

// loadVector reads a 1-D tensor of n elements as float32.
func loadVector(f *weights.File, name string, n int) ([]float32, error) {
	mat, err := loadVectorMatrix(f, name, n)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := weights.Dequantize(mat.typ, mat.data, out); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", f.Path, name, err)
	}
	return out, nil
}

func loadVectorMatrix(f *weights.File, name string, n int) (matrix, error) {
	t, err := f.TensorShaped(name, uint64(n))
	if err != nil {
		return matrix{}, fmt.Errorf("model: %w", err)
	}
	rowBytes, err := t.Type.RowBytes(uint64(n))
	if err != nil {
		return matrix{}, fmt.Errorf("%s: tensor %s: %w", f.Path, name, err)
	}
	if t.Data == nil || uint64(len(t.Data)) != rowBytes {
		return matrix{}, fmt.Errorf("%s: tensor %s holds %d bytes, want %d for %d %v", f.Path, name, len(t.Data), rowBytes, n, t.Type)
	}
	return matrix{name: name, data: t.Data, typ: t.Type, rows: 1, cols: n}, nil
}
