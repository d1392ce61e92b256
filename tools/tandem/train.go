package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/runtime/train"
	"github.com/tandem-llm/tandem/weights"
)

// trainFlags are the optimisation settings train and distill share.
type trainFlags struct {
	steps, batch, warmup, threads, ckptEvery, evalEvery, logEvery *int
	tokens                                                        *int64
	lr, minLR, clip                                               *float64
	seed                                                          *uint64
	typ, ckpt, init, name                                         *string
	resume                                                        *bool
}

func addTrainFlags(fs interface {
	Int(string, int, string) *int
	Int64(string, int64, string) *int64
	Float64(string, float64, string) *float64
	Uint64(string, uint64, string) *uint64
	String(string, string, string) *string
	Bool(string, bool, string) *bool
	Var(flag.Value, string, string)
}, lr float64) trainFlags {
	return trainFlags{
		tokens:    fs.Int64("tokens", 0, "tokens to train on (sets --steps: tokens / (batch × sequence length))"),
		steps:     fs.Int("steps", 0, "optimizer steps (default: from --tokens)"),
		batch:     fs.Int("batch", 8, "sequences per step"),
		lr:        fs.Float64("lr", lr, "peak learning rate (AdamW)"),
		minLR:     fs.Float64("min-lr", 0, "learning rate at the end of the cosine decay (default: lr/10)"),
		warmup:    fs.Int("warmup", 0, "warmup steps (default: 5% of the steps, at most 200)"),
		clip:      fs.Float64("clip", 1, "clip the gradient's global norm to this (0: off)"),
		seed:      fs.Uint64("seed", 1, "seed for the initial weights and the data order"),
		threads:   threadsFlag(fs),
		typ:       fs.String("type", "f32", "weight type of the output file: f32, f16, q8_0 or q4_0"),
		ckpt:      fs.String("ckpt", "", "checkpoint file (default: OUT.ckpt.gguf; its optimizer state goes beside it as .state)"),
		ckptEvery: fs.Int("ckpt-every", 100, "write a checkpoint every N steps (and at the end and on Ctrl-C; 0: only then)"),
		resume:    fs.Bool("resume", false, "continue from the checkpoint when there is one"),
		evalEvery: fs.Int("eval-every", 0, "held-out loss every N steps (default: 10 times per run)"),
		logEvery:  fs.Int("log-every", 10, "print progress every N steps"),
		init:      fs.String("init", "", "start from this model's weights instead of random ones (same shape)"),
		name:      fs.String("name", "", "general.name written into the model"),
	}
}

// check refuses, before any data is read or sampled, the training flags
// that are wrong on their own or together: the trainer found the numbers
// only after tokenizing the corpus (or sampling the target), with exit 1.
func (tf trainFlags) check(fs *flag.FlagSet) error {
	switch {
	case *tf.batch <= 0:
		return fmt.Errorf("%w: --batch %d must be positive", errUsage, *tf.batch)
	case *tf.steps < 0 || *tf.tokens < 0:
		return fmt.Errorf("%w: --steps %d and --tokens %d: want a positive count", errUsage, *tf.steps, *tf.tokens)
	case flagSet(fs, "steps") && flagSet(fs, "tokens"):
		return fmt.Errorf("%w: --steps and --tokens both set the run's length: give one", errUsage)
	case !(*tf.lr > 0 && *tf.lr < math.Inf(1)):
		return fmt.Errorf("%w: --lr %g: want a positive learning rate", errUsage, *tf.lr)
	case !(*tf.minLR >= 0 && *tf.minLR <= *tf.lr):
		return fmt.Errorf("%w: --min-lr %g: want 0 (lr/10) up to --lr %g", errUsage, *tf.minLR, *tf.lr)
	case *tf.warmup < 0:
		return fmt.Errorf("%w: --warmup %d: want 0 (the default) or more steps", errUsage, *tf.warmup)
	case !(*tf.clip >= 0 && *tf.clip < math.Inf(1)):
		return fmt.Errorf("%w: --clip %g: want a norm, or 0 for off", errUsage, *tf.clip)
	case *tf.ckptEvery < 0 || *tf.evalEvery < 0 || *tf.logEvery < 0:
		return fmt.Errorf("%w: --ckpt-every %d, --eval-every %d, --log-every %d: want step counts, not negative", errUsage, *tf.ckptEvery, *tf.evalEvery, *tf.logEvery)
	}
	return nil
}

// checkOutputs refuses, before any work, a model or checkpoint path that
// is one of the inputs (training text, vocabulary, --init: each was
// replaced by the model and lost), the other output, or one that could
// not be written (a checkpoint path that is a directory failed after the
// whole run). The folders are made first, as go build -o does.
func (tf trainFlags) checkOutputs(out string, inputs ...string) error {
	ckpt := *tf.ckpt
	if ckpt == "" {
		ckpt = out + ".ckpt.gguf"
	}
	for _, p := range []string{out, ckpt} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("cannot create the folder for %s: %w", p, err)
		}
	}
	if filepath.Clean(ckpt) == filepath.Clean(out) {
		return fmt.Errorf("%w: --ckpt %s is --out: the checkpoint goes beside the model, not over it", errUsage, ckpt)
	}
	if err := checkOutput("--out", out, inputs...); err != nil {
		return err
	}
	return checkOutput("--ckpt", ckpt, inputs...)
}

// options turns the flags into train.Options for sequences of seq tokens.
func (tf trainFlags) options(seq int, out string) (train.Options, error) {
	o := train.Options{Batch: *tf.batch, SeqLen: seq, Seed: *tf.seed, LR: *tf.lr, MinLR: *tf.minLR, Warmup: *tf.warmup,
		Clip: *tf.clip, CheckpointEvery: *tf.ckptEvery, Checkpoint: *tf.ckpt, EvalEvery: *tf.evalEvery, EvalWindows: 64, Name: *tf.name}
	if *tf.batch <= 0 {
		return o, fmt.Errorf("%w: --batch %d must be positive", errUsage, *tf.batch)
	}
	switch {
	case *tf.steps > 0:
		o.Steps = *tf.steps
	case *tf.tokens > 0:
		per := int64(*tf.batch * seq)
		o.Steps = int((*tf.tokens + per - 1) / per)
	default:
		return o, fmt.Errorf("%w: give --tokens or --steps", errUsage)
	}
	if o.MinLR == 0 {
		o.MinLR = o.LR / 10
	}
	if o.Warmup == 0 {
		o.Warmup = min(200, max(1, o.Steps/20))
	}
	if o.EvalEvery == 0 {
		o.EvalEvery = max(1, o.Steps/10)
	}
	if o.Checkpoint == "" {
		o.Checkpoint = out + ".ckpt.gguf"
	}
	return o, nil // checkOutputs made the folders and checked the paths
}

func (tf trainFlags) outType() (weights.DType, error) {
	dt, err := weights.ParseDType(*tf.typ)
	if err == nil {
		switch dt {
		case weights.F32, weights.F16, weights.Q8_0, weights.Q4_0:
			return dt, nil
		}
	}
	return 0, fmt.Errorf("%w: --type %q: want f32, f16, q8_0 or q4_0", errUsage, *tf.typ)
}

func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", "--data TEXT --vocab VOCAB --shape D,H,L,HEADS,KV[,CTX] --out MODEL.gguf (--tokens N | --steps N) [flags]",
		"Trains a llama-architecture model from scratch (or from --init) on a plain-text\n"+
			"corpus (documents separated by blank lines, each trained as BOS text EOS) and\n"+
			"writes a GGUF that every tandem command runs, with the vocabulary inside.\n"+
			"The shape is dim,hidden,layers,heads,kv_heads[,context] (the vocabulary size\n"+
			"comes from --vocab; the context defaults to 256). The last 1% of the documents\n"+
			"(--valid-frac) is held out, unless --valid gives a held-out text.\n\n"+
			"Training is deterministic: the same data, seed, shape and thread-independent\n"+
			"kernels give the same weights. Checkpoints are F32 GGUF models (loadable as\n"+
			"is) with the optimizer state beside them; Ctrl-C writes one, and --resume\n"+
			"continues exactly where the run stopped.", stdout, stderr,
		"tandem train --data stories.txt --vocab stories.vocab.gguf --shape 256,704,5,8,4 --tokens 4000000 --out target.gguf --type q8_0",
		"tandem train --data stories.txt --vocab stories.vocab.gguf --shape 256,704,5,8,4 --tokens 4000000 --out target.gguf --resume")
	data := fs.String("data", "", "training text (plain UTF-8, documents separated by blank lines)")
	valid := fs.String("valid", "", "held-out text (default: the last --valid-frac of --data's documents)")
	validFrac := fs.Float64("valid-frac", 0.01, "fraction of the documents held out when --valid is not given")
	vocabPath := fs.String("vocab", "", "vocabulary: a GGUF (from tandem corpus --vocab, or any model) or a tokenizer.bin")
	shapeFlag := fs.String("shape", "", "dim,hidden,layers,heads,kv_heads[,context]")
	out := fs.String("out", "", "output model file")
	untied := fs.Bool("untied", false, "give the output head its own matrix (default: tied to the embedding)")
	tf := addTrainFlags(fs, 1e-3)
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *data == "" || *out == "" {
		return fmt.Errorf("%w: --data and --out are required", errUsage)
	}
	if err := tf.check(fs); err != nil {
		return err
	}
	if flagSet(fs, "valid") && flagSet(fs, "valid-frac") {
		return fmt.Errorf("%w: --valid-frac holds out part of --data, and --valid gives the held-out text: give one", errUsage)
	}
	if err := tf.checkOutputs(*out, *data, *vocabPath, *valid, *tf.init); err != nil {
		return err
	}
	if *vocabPath == "" && *tf.init == "" {
		return fmt.Errorf("%w: --vocab is required (or --init, whose vocabulary is used)", errUsage)
	}
	dt, err := tf.outType()
	if err != nil {
		return err
	}

	// The vocabulary, the shape and the starting weights.
	var initParams *train.Params[float32]
	var cfg model.Config
	vp := *vocabPath
	if *tf.init != "" {
		if initParams, err = loadParams(*tf.init); err != nil {
			return err
		}
		cfg = initParams.Cfg
		if vp == "" {
			vp = *tf.init
		}
	}
	vmd, err := vocabMetadata(vp)
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromMetadata(vmd)
	if err != nil {
		return fmt.Errorf("%s: %w", vp, err)
	}
	switch {
	case *shapeFlag != "":
		c, err := train.ParseShape(*shapeFlag, tok.VocabSize(), 256)
		if err != nil {
			return fmt.Errorf("%w: --shape: %v", errUsage, err)
		}
		c.Tied = !*untied
		if initParams != nil && train.ShapeString(c) != train.ShapeString(cfg) {
			return fmt.Errorf("%w: --shape %s differs from --init's shape %s", errUsage, train.ShapeString(c), train.ShapeString(cfg))
		}
		cfg = c
	case initParams == nil:
		return fmt.Errorf("%w: --shape is required (or --init)", errUsage)
	}
	if cfg.Vocab != tok.VocabSize() {
		return fmt.Errorf("the vocabulary has %d tokens but the model's is %d", tok.VocabSize(), cfg.Vocab)
	}
	o, err := tf.options(cfg.Context, *out)
	if err != nil {
		return err
	}

	// The text.
	start := time.Now()
	docs, err := readDocs(*data)
	if err != nil {
		return err
	}
	var trainDocs, validDocs []string
	if *valid != "" {
		trainDocs = docs
		if validDocs, err = readDocs(*valid); err != nil {
			return err
		}
	} else {
		if !(*validFrac >= 0 && *validFrac < 1) { // NaN fails too
			return fmt.Errorf("%w: --valid-frac %g: want 0 <= f < 1", errUsage, *validFrac)
		}
		k := int(float64(len(docs)) * *validFrac)
		if *validFrac > 0 {
			k = max(1, k)
		}
		if k >= len(docs) {
			return fmt.Errorf("%s has %d documents: too few to hold %d out; give more text or --valid", *data, len(docs), k)
		}
		trainDocs, validDocs = docs[:len(docs)-k], docs[len(docs)-k:]
	}
	trainTok, err := train.EncodeDocs(tok, trainDocs)
	if err != nil {
		return err
	}
	var validTok []int32
	if len(validDocs) > 0 {
		if validTok, err = train.EncodeDocs(tok, validDocs); err != nil {
			return err
		}
		if len(validTok) < o.SeqLen+1 {
			return fmt.Errorf("the held-out text has %d tokens, fewer than one window of %d; hold out more (--valid-frac) or pass --valid: %w",
				len(validTok), o.SeqLen+1, train.ErrTooLittleData)
		}
	}
	fmt.Fprintf(stderr, "data: %d documents, %d training tokens, %d held out (tokenized in %.1fs)\n",
		len(trainDocs), len(trainTok), len(validTok), time.Since(start).Seconds())

	p := initParams
	if p == nil {
		if p, err = train.NewParams[float32](cfg); err != nil {
			return err
		}
		p.Init(o.Seed)
	}
	pool := kernels.NewPool(*tf.threads)
	defer pool.Close()
	o.Vocab = vmd
	tr, err := train.NewTrainer(p, trainTok, validTok, nil, pool, o)
	if err != nil {
		return err
	}
	return finishTraining(tr, tf, o, vmd, *out, dt, pool, stdout, stderr)
}

// finishTraining resumes when asked, runs, and writes the output model.
func finishTraining(tr *train.Trainer, tf trainFlags, o train.Options, vmd *weights.Metadata, out string, dt weights.DType,
	pool *kernels.Pool, stdout, stderr io.Writer) error {
	c := tr.P.Cfg
	if *tf.resume {
		switch err := tr.Resume(o.Checkpoint); {
		case errors.Is(err, train.ErrNoCheckpoint):
			fmt.Fprintf(stderr, "resume: no checkpoint at %s yet; starting afresh\n", o.Checkpoint)
		case err != nil:
			return err
		default:
			fmt.Fprintf(stderr, "resume: continuing %s from step %d of %d\n", o.Checkpoint, tr.State.Step, o.Steps)
		}
	}
	fmt.Fprintf(stderr, "model: shape %s, vocabulary %d, %s parameters (%s head); %d steps of %d×%d tokens (%d epochs of %d windows); %d threads, %s kernels\n",
		train.ShapeString(c), c.Vocab, humanCount(train.CountParams(c)), map[bool]string{true: "tied", false: "untied"}[c.Tied],
		o.Steps, o.Batch, o.SeqLen, (o.Steps*o.Batch+tr.Windows().Len()-1)/tr.Windows().Len(), tr.Windows().Len(), pool.Threads(), kernels.Backend())
	logEvery := max(1, *tf.logEvery)
	var lossSum float64
	var lossN int
	o.Log = func(pr train.Progress) {
		lossSum += pr.Loss
		lossN++
		if pr.Step%logEvery == 0 || pr.Step == pr.Steps || pr.ValidOK {
			eta := time.Duration(float64(pr.Steps-pr.Step) * float64(o.Batch*o.SeqLen) / max(pr.TokPerSec, 1e-9) * float64(time.Second))
			line := fmt.Sprintf("step %d/%d  loss %.4f  lr %.2e  grad %.3f  %.0f tok/s  %s elapsed, eta %s",
				pr.Step, pr.Steps, lossSum/float64(lossN), pr.LR, pr.GradNorm, pr.TokPerSec,
				pr.Elapsed.Round(time.Second), eta.Round(time.Second))
			if pr.ValidOK {
				line += fmt.Sprintf("  held-out %.4f", pr.ValidLoss)
			}
			fmt.Fprintln(stderr, line)
			lossSum, lossN = 0, 0
		}
	}
	tr.SetLog(o.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	startTokens := tr.State.Tokens
	if err := tr.Run(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			return interruptedError(fmt.Sprintf("interrupted at step %d; checkpoint %s written: run the same command with --resume to continue", tr.State.Step, o.Checkpoint))
		}
		return err
	}
	wall := time.Since(start)
	name := o.Name
	if name == "" {
		name = fmt.Sprintf("tandem %s", train.ShapeString(c))
	}
	if err := train.WriteModel(out, tr.P, train.ModelMetadata(tr.P, name, dt, vmd), dt); err != nil {
		return err
	}
	st, _ := os.Stat(out)
	valid := ""
	if vl, err := tr.Evaluate(); err == nil {
		valid = fmt.Sprintf(", held-out loss %.4f (F32 weights)", vl)
	}
	fmt.Fprintf(stdout, "wrote %s: %s %s, %d bytes; trained %d tokens in %s (%.0f tok/s, %d threads)%s\n",
		out, humanCount(train.CountParams(c)), dt, st.Size(), tr.State.Tokens-startTokens, wall.Round(time.Second),
		float64(tr.State.Tokens-startTokens)/wall.Seconds(), pool.Threads(), valid)
	return nil
}

// loadParams reads a model file's weights as float32 training parameters.
func loadParams(path string) (*train.Params[float32], error) {
	f, err := weights.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return train.LoadParams[float32](f)
}

func humanCount(n int) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
