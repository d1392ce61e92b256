package train

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/weights"
)

// runtimeLogits runs runtime/model on the file at path over one sequence
// as a prefill chain with logits at every slot.
func runtimeLogits(t *testing.T, path string, tokens []int32) ([]float32, model.Config) {
	t.Helper()
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := model.Load(f, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cache, err := m.NewCache(0, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	seq, _ := cache.NewSeq()
	var b model.Batch
	for i, tok := range tokens {
		b.Add(tok, int32(i), seq, i-1, true)
	}
	var out model.Logits
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	V := m.Config().Vocab
	got := make([]float32, 0, len(tokens)*V)
	for i := range tokens {
		got = append(got, out.Row(i)...)
	}
	return got, m.Config()
}

// TestTrainerMatchesRuntime: a model the trainer writes loads in
// runtime/model, and the runtime's logits equal the trainer's forward on
// the same weights: F32 within 1e-4 of the largest logit (the two sum
// in different orders), Q8_0 within 5% (its weights are rounded to 8
// bits, which is the quantization error, not a mismatch).
func TestTrainerMatchesRuntime(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, tied := range []bool{true, false} {
		c := model.Config{Dim: 64, Hidden: 96, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 70, Context: 32, Eps: 1e-5, RopeTheta: 10000, Tied: tied}
		p, err := NewParams[float32](c)
		if err != nil {
			t.Fatal(err)
		}
		randomize(p, 11)
		for i := range p.Data {
			p.Data[i] *= 0.3
		}
		b := randomBatch(c, 1, 20, 6, false, false)
		e, _ := NewEngine[float32](c, pool)
		if _, err := e.Forward(p, b); err != nil {
			t.Fatal(err)
		}
		want := e.Logits()
		for _, tc := range []struct {
			typ weights.DType
			tol float64
		}{{weights.F32, 1e-4}, {weights.Q8_0, 5e-2}} {
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := WriteModel(path, p, ModelMetadata(p, "test", tc.typ, nil), tc.typ); err != nil {
				t.Fatal(err)
			}
			got, mc := runtimeLogits(t, path, b.Tokens)
			if mc.Tied != tied || mc.Dim != c.Dim || mc.KVHeads != c.KVHeads {
				t.Errorf("runtime config %+v, trained %+v", mc, c)
			}
			var worst, scale float64
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i])))
				scale = max(scale, math.Abs(float64(want[i])))
			}
			if worst > tc.tol*scale {
				t.Errorf("tied=%v %s: runtime logits differ from the trainer's by %.3g (largest logit %.3g, tolerance %g of it)", tied, tc.typ, worst, scale, tc.tol)
			}
		}
	}
}

// microCorpus is a fixed text whose characters are the tokens.
func microCorpus(repeat int) ([]int32, int) {
	text := strings.Repeat("the cat sat on the mat. the dog sat on the log. a cat and a dog ran. ", repeat)
	ids := map[rune]int32{}
	var out []int32
	for _, r := range text {
		id, ok := ids[r]
		if !ok {
			id = int32(len(ids))
			ids[r] = id
		}
		out = append(out, id)
	}
	return out, len(ids)
}

func microOptions(steps int) Options {
	return Options{Steps: steps, Batch: 4, SeqLen: 24, Seed: 7, LR: 1e-2, MinLR: 1e-3, Warmup: 3, Clip: 1, Name: "micro"}
}

func microTrainer(t *testing.T, o Options, pool *kernels.Pool) *Trainer {
	t.Helper()
	tokens, vocab := microCorpus(12)
	c := model.Config{Dim: 32, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: vocab, Context: 32, Tied: true}
	p, err := NewParams[float32](c)
	if err != nil {
		t.Fatal(err)
	}
	p.Init(o.Seed)
	split := len(tokens) * 9 / 10
	tr, err := NewTrainer(p, tokens[:split], tokens[split:], nil, pool, o)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestBadOptions: options no run can use are refused, NaN and infinities
// included (a check written x < 0 lets NaN through).
func TestBadOptions(t *testing.T) {
	tokens, vocab := microCorpus(12)
	c := model.Config{Dim: 32, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: vocab, Context: 32, Tied: true}
	p, err := NewParams[float32](c)
	if err != nil {
		t.Fatal(err)
	}
	pool := kernels.NewPool(1)
	defer pool.Close()
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		name string
		edit func(*Options)
	}{
		{"lr NaN", func(o *Options) { o.LR = nan }},
		{"lr +Inf", func(o *Options) { o.LR, o.MinLR = inf, inf }},
		{"lr 0", func(o *Options) { o.LR = 0 }},
		{"min lr NaN", func(o *Options) { o.MinLR = nan }},
		{"min lr above lr", func(o *Options) { o.MinLR = 1 }},
		{"clip NaN", func(o *Options) { o.Clip = nan }},
		{"clip negative", func(o *Options) { o.Clip = -1 }},
	} {
		o := microOptions(2)
		tc.edit(&o)
		if _, err := NewTrainer(p, tokens[:200], tokens[200:], nil, pool, o); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := NewTrainer(p, tokens[:200], tokens[200:], nil, pool, microOptions(2)); err != nil {
		t.Errorf("good options: %v", err)
	}
	// A batch whose activations exceed the memory available is refused
	// before anything is allocated (two billion ran the process out of
	// memory).
	o := microOptions(2)
	o.Batch = 2_000_000_000
	if _, err := NewTrainer(p, tokens[:200], tokens[200:], nil, pool, o); err == nil || !strings.Contains(err.Error(), "lower the batch") {
		t.Errorf("a batch of two billion: %v, want an error saying to lower the batch", err)
	}
	defer func(old func() (uint64, error)) { availableMemory = old }(availableMemory)
	availableMemory = func() (uint64, error) { return 1 << 20, nil }
	o.Batch = 64
	if _, err := NewTrainer(p, tokens[:200], tokens[200:], nil, pool, o); err == nil || !strings.Contains(err.Error(), "1.0 MiB is available") {
		t.Errorf("64 sequences with 1 MiB free: %v, want an error naming the memory available", err)
	}
}

// TestActivationElems: the estimate the memory check uses counts every
// buffer the engine allocates, once (a block's output is the next one's
// input).
func TestActivationElems(t *testing.T) {
	for _, c := range []model.Config{
		{Dim: 32, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 50, Context: 32},
		{Dim: 48, Hidden: 96, Layers: 3, Heads: 6, KVHeads: 6, Vocab: 70, Context: 16},
	} {
		e, err := NewEngine[float32](c, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, bt := range [][2]int{{1, 1}, {3, 7}, {4, 16}} {
			e.size(bt[0], bt[1])
			seen := map[uintptr]bool{}
			var ts, f64s int
			count := func(v reflect.Value) {
				for i := range v.NumField() {
					f := v.Field(i)
					if f.Kind() != reflect.Slice || f.Len() == 0 || seen[f.Pointer()] {
						continue
					}
					switch f.Type().Elem().Kind() {
					case reflect.Float32:
						seen[f.Pointer()] = true
						ts += f.Len()
					case reflect.Float64:
						seen[f.Pointer()] = true
						f64s += f.Len()
					}
				}
			}
			ev := reflect.ValueOf(e).Elem()
			for l := range e.acts {
				count(reflect.ValueOf(&e.acts[l]).Elem())
			}
			count(ev)
			ts -= len(e.cos) + len(e.sin) // the RoPE table, not activations
			wantTs, wantF64s := activationElems(c, bt[0], bt[1])
			if float64(ts) != wantTs || float64(f64s) != wantF64s {
				t.Errorf("%s, %d×%d: the engine allocates %d + %d float64 elements, the estimate says %v + %v", ShapeString(c), bt[0], bt[1], ts, f64s, wantTs, wantF64s)
			}
		}
	}
}

// TestLossFalls: a micro model on a micro corpus learns it: the training
// loss drops to under a third of where it starts and the held-out loss
// under half of the uniform guess.
func TestLossFalls(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	var losses []float64
	o := microOptions(60)
	o.Log = func(p Progress) { losses = append(losses, p.Loss) }
	tr := microTrainer(t, o, pool)
	v0, err := tr.Evaluate()
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	v1, _ := tr.Evaluate()
	first, last := losses[0], losses[len(losses)-1]
	uniform := math.Log(float64(tr.P.Cfg.Vocab))
	t.Logf("train loss %.3f -> %.3f, held-out %.3f -> %.3f (uniform %.3f)", first, last, v0, v1, uniform)
	if last > first/3 || v1 > uniform/2 {
		t.Errorf("loss did not fall: train %.3f -> %.3f, held-out %.3f -> %.3f (uniform %.3f)", first, last, v0, v1, uniform)
	}
}

// TestResumeIsExact: a run interrupted after step 5 and resumed from its
// checkpoint ends with bit-identical weights to an uninterrupted run, and
// a resume with other settings is refused.
func TestResumeIsExact(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	dir := t.TempDir()
	const steps = 10

	o := microOptions(steps)
	full := microTrainer(t, o, pool)
	if err := full.Run(context.Background()); err != nil {
		t.Fatal(err)
	}

	o.Checkpoint = filepath.Join(dir, "ckpt.gguf")
	o.CheckpointEvery = 3
	ctx, cancel := context.WithCancel(context.Background())
	o.Log = func(p Progress) {
		if p.Step == 5 {
			cancel()
		}
	}
	a := microTrainer(t, o, pool)
	if err := a.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	if a.State.Step != 5 {
		t.Fatalf("interrupted at step %d", a.State.Step)
	}

	o.Log = nil
	b := microTrainer(t, o, pool)
	if err := b.Resume(o.Checkpoint); err != nil {
		t.Fatal(err)
	}
	if b.State.Step != 5 {
		t.Fatalf("resumed at step %d, want 5", b.State.Step)
	}
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range full.P.Data {
		if full.P.Data[i] != b.P.Data[i] {
			t.Fatalf("parameter %d: uninterrupted %v, resumed %v", i, full.P.Data[i], b.P.Data[i])
		}
	}
	// The final checkpoint is a model the runtime loads.
	f, err := weights.Open(o.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	f.Close()

	o2 := o
	o2.LR *= 2
	c := microTrainer(t, o2, pool)
	if err := c.Resume(o.Checkpoint); err == nil || !strings.Contains(err.Error(), "learning rate") {
		t.Errorf("resume with another learning rate: %v", err)
	}
	if err := c.Resume(filepath.Join(dir, "none.gguf")); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("resume without a checkpoint: %v", err)
	}
	os.Remove(StatePath(o.Checkpoint))
	if err := c.Resume(o.Checkpoint); err == nil || !strings.Contains(err.Error(), "state") {
		t.Errorf("resume without the state sidecar: %v", err)
	}
}

// TestNonFiniteStops: a weight that becomes infinite mid-run stops
// training with the step and the layer where the first non-finite value
// appeared, and the last good checkpoint is kept.
func TestNonFiniteStops(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, tc := range []struct {
		name   string
		poison func(p *Params[float32])
		want   string
	}{
		{"feed-forward weight", func(p *Params[float32]) { p.Layers[1].Up[5] = float32(math.Inf(1)) }, "layer 1 (blk.1, feed-forward (gate/up))"},
		{"attention weight", func(p *Params[float32]) { p.Layers[0].Wk[0] = float32(math.NaN()) }, "layer 0 (blk.0, attention (q/k/v and softmax))"},
		{"embedding", func(p *Params[float32]) { p.Emb[0] = float32(math.NaN()) }, "token embedding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := microOptions(10)
			o.Checkpoint = filepath.Join(t.TempDir(), "ckpt.gguf")
			o.CheckpointEvery = 2
			var tr *Trainer
			o.Log = func(p Progress) {
				if p.Step == 4 {
					tc.poison(tr.P)
				}
			}
			tr = microTrainer(t, o, pool)
			err := tr.Run(context.Background())
			if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "step 5") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want step 5 and %q", err, tc.want)
			}
			_, _, st, err := LoadCheckpoint(o.Checkpoint)
			if err != nil || st.Step != 4 {
				t.Errorf("last checkpoint at step %d (%v), want 4", st.Step, err)
			}
		})
	}
}

func TestBadShapesAndData(t *testing.T) {
	for _, tc := range []struct{ shape, want string }{
		{"64,128,2,6,2", "does not divide into 6 heads"},
		{"60,128,2,4,4", "odd"},
		{"64,128,2,8,3", "do not divide 8 heads"},
		{"64,128,2", "want dim,hidden,layers,heads,kvheads"},
		{"64,x,2,4,4", "positive integer"},
	} {
		if _, err := ParseShape(tc.shape, 100, 64); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("shape %q: %v, want %q", tc.shape, err, tc.want)
		}
	}
	if c, err := ParseShape("64,128,2,8,4,128", 100, 64); err != nil || c.Context != 128 || c.HeadDim != 8 {
		t.Errorf("good shape: %+v %v", c, err)
	}
	if _, err := NewWindows(make([]int32, 10), 16, 1); !errors.Is(err, ErrTooLittleData) {
		t.Errorf("10 tokens for a 16-token context: %v", err)
	}
}

func FuzzParseShape(f *testing.F) {
	f.Add("64,128,2,8,4,128")
	f.Add("1,1,1,1,1")
	f.Add("64,,2,8,4")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseShape(s, 50, 64)
		if err != nil {
			return
		}
		if CheckConfig(c) != nil || c.Dim%c.Heads != 0 || c.Heads%c.KVHeads != 0 || c.HeadDim%2 != 0 || ShapeString(c) == "" {
			t.Fatalf("%q parsed to an invalid shape %+v", s, c)
		}
	})
}
