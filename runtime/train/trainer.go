package train

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/sysmem"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// Options configures a training run.
type Options struct {
	Steps  int // optimizer steps
	Batch  int // sequences per step
	SeqLen int // tokens per sequence (at most the model's context)
	Seed   uint64
	LR     float64 // peak learning rate
	MinLR  float64 // learning rate at the end of the cosine decay
	Warmup int     // warmup steps
	Clip   float64 // global gradient norm clip (0: off)
	// EvalEvery evaluates the held-out loss every so many steps (0: only
	// at the end), over at most EvalWindows windows.
	EvalEvery   int
	EvalWindows int
	// Checkpoint, when set, is where checkpoints go every
	// CheckpointEvery steps (0: only at the end and on interruption).
	Checkpoint      string
	CheckpointEvery int
	// Name is the model's general.name.
	Name string
	// Vocab holds the tokenizer.ggml.* keys written into every file.
	Vocab *weights.Metadata
	// Log is called after every step (and after each evaluation).
	Log func(Progress)
}

// Progress is reported after each step.
type Progress struct {
	Step, Steps int
	Loss        float64 // this step's training loss
	LR          float64
	GradNorm    float64 // before clipping
	Tokens      int64   // tokens trained on so far (this run and the ones it resumes)
	TokPerSec   float64 // over this run
	Elapsed     time.Duration
	// ValidLoss is set (ValidOK) on steps that evaluated.
	ValidLoss float64
	ValidOK   bool
}

// Teacher gives the probabilities a draft is distilled towards.
type Teacher interface {
	// Probs fills dst (B·T·Vocab) with the teacher's next-token
	// distribution at every position of the batch's sequences.
	Probs(b *Batch, dst []float32) error
}

// Trainer runs the training loop for one model.
type Trainer struct {
	P     *Params[float32]
	Opt   *AdamW
	State State

	pool    *kernels.Pool
	eng     *Engine[float32]
	grad    *Params[float32]
	train   *Windows
	valid   *Windows
	teacher Teacher
	opts    Options
	batch   Batch
}

// NewTrainer prepares a run over the train and held-out token streams.
// p is the starting point (Init'd or loaded); teacher is nil for plain
// next-token training. The optimizer state starts empty; Resume replaces
// it and p from a checkpoint.
func NewTrainer(p *Params[float32], train, valid []int32, teacher Teacher, pool *kernels.Pool, o Options) (*Trainer, error) {
	tw, err := NewWindows(train, o.SeqLen, o.Seed)
	if err != nil {
		return nil, fmt.Errorf("train: training text: %w", err)
	}
	var vw *Windows
	if len(valid) > 0 {
		if vw, err = NewWindows(valid, o.SeqLen, o.Seed); err != nil {
			return nil, fmt.Errorf("train: held-out text: %w", err)
		}
	}
	return NewTrainerWindows(p, tw, vw, teacher, pool, o)
}

// NewTrainerWindows is NewTrainer over prepared windows (valid may be
// nil); their length must be o.SeqLen.
func NewTrainerWindows(p *Params[float32], train, valid *Windows, teacher Teacher, pool *kernels.Pool, o Options) (*Trainer, error) {
	c := p.Cfg
	switch {
	case o.Steps <= 0 || o.Batch <= 0:
		return nil, fmt.Errorf("train: steps %d and batch %d must be positive", o.Steps, o.Batch)
	case o.SeqLen <= 0 || o.SeqLen > c.Context:
		return nil, fmt.Errorf("train: sequence length %d is outside 1..%d (the model's context)", o.SeqLen, c.Context)
	case !(o.LR > 0 && o.LR < math.Inf(1)) || !(o.MinLR >= 0 && o.MinLR <= o.LR):
		return nil, fmt.Errorf("train: learning rate %g and minimum %g: want 0 <= min <= lr, lr > 0 and finite", o.LR, o.MinLR)
	case o.Warmup < 0 || !(o.Clip >= 0):
		return nil, fmt.Errorf("train: warmup %d and clip %g: want numbers, not negative", o.Warmup, o.Clip)
	}
	if train.t != o.SeqLen || (valid != nil && valid.t != o.SeqLen) {
		return nil, fmt.Errorf("train: windows of %d tokens for a sequence length of %d", train.t, o.SeqLen)
	}
	// Refused here rather than failing the first allocation: a batch of
	// two billion ran the process out of memory.
	if need := activationBytes(c, o.Batch, o.SeqLen, teacher != nil); need > 0 {
		if avail, err := availableMemory(); err == nil && need > float64(avail) {
			return nil, fmt.Errorf("train: %d sequences of %d tokens a step need %s for activations, and %s is available; lower the batch",
				o.Batch, o.SeqLen, progress.Bytes(uint64(min(need, math.MaxInt64))), progress.Bytes(avail))
		}
	}
	t := &Trainer{P: p, pool: pool, train: train, valid: valid, teacher: teacher, opts: o}
	var err error
	if t.eng, err = NewEngine[float32](c, pool); err != nil {
		return nil, err
	}
	if t.grad, err = NewParams[float32](c); err != nil {
		return nil, err
	}
	t.Opt = NewAdamW(len(p.Data))
	t.State = State{Steps: o.Steps, Batch: o.Batch, SeqLen: o.SeqLen, Seed: o.Seed, Shape: ShapeString(c),
		DataHash: hashTokens(train.tokens, train.stride), LR: o.LR, MinLR: o.MinLR, Warmup: o.Warmup, Clip: o.Clip, Distill: teacher != nil}
	return t, nil
}

// activationBytes is what a step of b sequences of t tokens allocates
// for activations (float32), with the teacher's soft targets when
// distilling.
func activationBytes(c model.Config, b, t int, distill bool) float64 {
	ts, f64s := activationElems(c, b, t)
	need := 4*ts + 8*f64s
	if distill {
		need += 4 * float64(b) * float64(t) * float64(c.Vocab)
	}
	return need
}

// availableMemory is the memory the machine has free (a test seam).
var availableMemory = sysmem.Available

// SetLog replaces Options.Log.
func (t *Trainer) SetLog(f func(Progress)) { t.opts.Log = f }

// Windows returns the training windows (for reporting epoch sizes).
func (t *Trainer) Windows() *Windows { return t.train }

// Resume continues from the checkpoint at path: the parameters, the
// optimizer moments and the step. The checkpoint must come from a run
// with the same settings and data.
func (t *Trainer) Resume(path string) error {
	p, opt, st, err := LoadCheckpoint(path)
	if err != nil {
		return err
	}
	if err := st.compatible(t.State); err != nil {
		return fmt.Errorf("train: resume %s: %w", path, err)
	}
	if len(p.Data) != len(t.P.Data) || ShapeString(p.Cfg) != ShapeString(t.P.Cfg) || p.Cfg.Tied != t.P.Cfg.Tied {
		return fmt.Errorf("train: resume %s: the checkpoint's shape %s differs from %s", path, ShapeString(p.Cfg), ShapeString(t.P.Cfg))
	}
	t.P.CopyFrom(p)
	t.Opt = opt
	t.State = st
	return nil
}

// hashTokens fingerprints the training stream, so a resume with other
// data is refused.
func hashTokens(tokens []int32, stride int) string {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, uint32(stride))
	var b [4]byte
	for _, v := range tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(v))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// Run trains until the configured step count or until ctx is done. On
// cancellation it saves a checkpoint (when Options.Checkpoint is set) and
// returns ctx's error, so the run can be resumed. A NaN or infinite loss
// or gradient stops it with an error wrapping ErrNonFinite that names the
// step and where the value appeared; no checkpoint is written then, so
// the last good one stays.
func (t *Trainer) Run(ctx context.Context) error {
	o := t.opts
	sched := Schedule{Peak: o.LR, Min: o.MinLR, Warmup: o.Warmup, Steps: o.Steps}
	start := time.Now()
	startTokens := t.State.Tokens
	priorSeconds := t.State.Seconds
	var soft []float32
	save := func() error {
		if o.Checkpoint == "" {
			return nil
		}
		t.State.AdamT = t.Opt.T
		t.State.Seconds = priorSeconds + time.Since(start).Seconds()
		md := ModelMetadata(t.P, o.Name, weights.F32, o.Vocab)
		return SaveCheckpoint(o.Checkpoint, t.P, md, t.Opt, t.State)
	}
	for t.State.Step < o.Steps {
		if err := ctx.Err(); err != nil {
			if serr := save(); serr != nil {
				return errors.Join(err, serr)
			}
			return err
		}
		step := t.State.Step
		t.train.Batch(step, o.Batch, &t.batch)
		t.batch.Soft = nil
		if t.teacher != nil {
			n := o.Batch * o.SeqLen * t.P.Cfg.Vocab
			if cap(soft) < n {
				soft = make([]float32, n)
			}
			soft = soft[:n]
			if err := t.teacher.Probs(&t.batch, soft); err != nil {
				return fmt.Errorf("train: step %d: teacher: %w", step+1, err)
			}
			t.batch.Soft = soft
		}
		loss, err := t.eng.Forward(t.P, &t.batch)
		if err != nil {
			return fmt.Errorf("train: step %d: %w", step+1, err)
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			where := t.eng.firstNonFinite()
			if where == "" {
				where = "the loss (every activation is finite: the logits overflow the softmax)"
			}
			return fmt.Errorf("train: step %d: loss is %v; first non-finite value in %s; lower --lr or resume from an earlier checkpoint: %w",
				step+1, loss, where, ErrNonFinite)
		}
		if err := t.eng.Backward(t.P, t.grad); err != nil {
			return fmt.Errorf("train: step %d: %w", step+1, err)
		}
		norm := gradNorm(t.pool, t.grad.Data)
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			return fmt.Errorf("train: step %d: gradient of %s is not finite; lower --lr or resume from an earlier checkpoint: %w",
				step+1, firstNonFiniteTensor(t.grad), ErrNonFinite)
		}
		scale := 1.0
		if o.Clip > 0 && norm > o.Clip {
			scale = o.Clip / norm
		}
		lr := sched.At(step)
		t.Opt.Step(t.pool, t.P, t.grad, lr, scale)
		t.State.Step++
		t.State.Tokens += int64(o.Batch * o.SeqLen)

		pr := Progress{Step: t.State.Step, Steps: o.Steps, Loss: loss, LR: lr, GradNorm: norm, Tokens: t.State.Tokens,
			Elapsed: time.Since(start)}
		pr.TokPerSec = float64(t.State.Tokens-startTokens) / max(pr.Elapsed.Seconds(), 1e-9)
		last := t.State.Step == o.Steps
		if t.valid != nil && (last || (o.EvalEvery > 0 && t.State.Step%o.EvalEvery == 0)) {
			vl, err := t.Evaluate()
			if err != nil {
				return err
			}
			pr.ValidLoss, pr.ValidOK = vl, true
		}
		if o.Log != nil {
			o.Log(pr)
		}
		if last || (o.CheckpointEvery > 0 && t.State.Step%o.CheckpointEvery == 0) {
			if err := save(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Evaluate returns the mean loss on the held-out windows (at most
// Options.EvalWindows of them, in stream order, so it does not depend on
// the seed). Distillation runs evaluate against hard targets.
func (t *Trainer) Evaluate() (float64, error) {
	if t.valid == nil {
		return 0, fmt.Errorf("train: no held-out text")
	}
	n := t.valid.Len()
	if t.opts.EvalWindows > 0 {
		n = min(n, t.opts.EvalWindows)
	}
	var b Batch
	var total float64
	var count int
	for first := 0; first < n; first += t.opts.Batch {
		t.valid.Sequential(first, min(t.opts.Batch, n-first), t.opts.Batch, &b)
		loss, err := t.eng.Forward(t.P, &b)
		if err != nil {
			return 0, fmt.Errorf("train: evaluate: %w", err)
		}
		total += loss * float64(t.eng.count)
		count += t.eng.count
	}
	if count == 0 {
		return 0, nil
	}
	return total / float64(count), nil
}

// firstNonFiniteTensor names the first parameter tensor whose gradient
// holds a NaN or an infinity.
func firstNonFiniteTensor(g *Params[float32]) string {
	for _, t := range g.Tensors {
		if !finite(t.Data) {
			return t.Name
		}
	}
	return "an unknown tensor"
}
