package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/bench"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// maxCalibrationPrompts bounds --n.
const maxCalibrationPrompts = 100_000

func runCalibrate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("calibrate", "[--model FILE] [--tokenizer FILE] [--prompts FILE] [flags]",
		"Trains the scheduler's uncertainty estimator for a model: generates answers\n"+
			"to a corpus of prompts with the model itself, then fits a small MLP from the\n"+
			"prompts' linguistic-uncertainty features and length to the output lengths.\n"+
			"It reports the estimator's error on held-out prompts next to the fallback\n"+
			"(predicting the prompt length) and writes MODEL.calib.json beside the model\n"+
			"(for the embedded model: the user config directory, where it takes the place\n"+
			"of the calibration the model ships with), where tandem serve and tandem\n"+
			"bench sched find it. The default corpus is the scheduling benchmark's\n"+
			"prompt mix; --prompts takes one prompt per line, or JSON lines\n"+
			`{"prompt": "...", "max_tokens": N}.`, stdout, stderr,
		"tandem calibrate --model stories260K.gguf",
		"tandem calibrate --model model.gguf --prompts my-prompts.jsonl --n 1000")
	modelPath := fs.String("model", "", "model file (default: the embedded model)")
	tokPath := fs.String("tokenizer", "", "tokenizer.bin or GGUF vocabulary (default: the model's own)")
	promptsPath := fs.String("prompts", "", "prompt file: text lines or JSON lines (default: the built-in corpus)")
	n := fs.Int("n", 400, "prompts to generate from: drawn from the built-in corpus, or the first N of --prompts (all of them when --n is not given); at most 100000")
	maxTokens := fs.Int("max-tokens", 448, "cap on every generation")
	temp := fs.Float64("temperature", 0.8, "sampling temperature of the generations (0: greedy)")
	seed := fs.Uint64("seed", 1, "corpus, sampling and training seed")
	lanes := fs.String("lanes", "", "lanes that generate, comma separated: threads per CPU lane, pinned to CPUs with @ as serve's --lanes, or cuda / cuda:N for a GPU lane (a build with -tags cuda) (default: one CPU lane per physical core, 1 thread each)")
	epochs := fs.Int("epochs", 1500, "MLP training epochs")
	out := fs.String("out", "", "where to write the calibration (default: beside the model)")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *n <= 0 || *maxTokens <= 0 || *epochs <= 0 {
		return fmt.Errorf("%w: --n, --max-tokens and --epochs must be positive", errUsage)
	}
	if _, err := checkSampling(*maxTokens, *temp, 0, 0, 0, 1); err != nil { // the temperature's range is generate's
		return err
	}
	// Two billion prompts ran out of memory building the corpus.
	if *n > maxCalibrationPrompts {
		return fmt.Errorf("%w: --n %d: at most %d prompts (a few hundred calibrate well)", errUsage, *n, maxCalibrationPrompts)
	}
	specs := onePerCore()
	if *lanes != "" {
		var err error
		if specs, err = parseLanes(*lanes); err != nil {
			return err
		}
	}
	noteTurns(stderr, "calibrate", specs)
	f, err := openModel(*modelPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tok, err := loadTokenizer(f, *tokPath, stderr)
	if err != nil {
		return err
	}
	var prompts []bench.WorkRequest
	if *promptsPath != "" {
		if prompts, err = readPrompts(*promptsPath, *maxTokens); err != nil {
			return err
		}
		if flagSet(fs, "n") && *n < len(prompts) {
			prompts = prompts[:*n]
		}
	} else {
		prompts = bench.CalibrationPrompts(*n, bench.VarianceNormal, *maxTokens, *seed)
	}
	path := *out
	if path == "" {
		if path, err = calibrationPath(*modelPath); err != nil {
			return err
		}
		if *modelPath == "" {
			// The user config directory is ours to make: a new user has none.
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
		}
	}
	// Refuse an output it cannot write now, not after the generations.
	if err := checkOutput("--out", path); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	cal, err := calibrate(ctx, f, tok, prompts, calibrateOptions{lanes: specs, temperature: *temp, seed: *seed, epochs: *epochs,
		maxTokens: *maxTokens, modelPath: *modelPath}, stderr)
	if err != nil {
		return err
	}
	if err := cal.Save(path); err != nil {
		return err
	}
	v := cal.Validation
	fmt.Fprintf(stdout, "calibrated on %d generations in %.1fs (%d held out for validation)\n", cal.Samples, time.Since(start).Seconds(), v.N)
	fmt.Fprintf(stdout, "\n| estimator | mean abs. error (tokens) |\n|---|---|\n| MLP on features | %.1f |\n| prompt length (fallback) | %.1f |\n| training mean | %.1f |\n",
		v.MAE, v.FallbackMAE, v.MeanMAE)
	fmt.Fprintf(stdout, "\nrank correlation of prediction and truth: %.3f\nscore percentiles 50/90/99: %.0f / %.0f / %.0f tokens\nwrote %s\n",
		v.Spearman, pct(cal.Scores, 10), pct(cal.Scores, 18), pct(cal.Scores, 20), path)
	return nil
}

func pct(s []float64, i int) float64 {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// calibrationPath is where the calibration of a model lives: beside the
// file, or for the embedded model in the user config directory.
func calibrationPath(modelPath string) (string, error) {
	if modelPath != "" {
		return sched.CalibrationPath(modelPath), nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no config directory for the embedded model's calibration (%v); pass --out", err)
	}
	return filepath.Join(dir, "tandem", "default.calib.json"), nil
}

// loadEstimator reads the calibration at path (explicit), or the model's
// default one when it exists; the embedded model otherwise has the one
// it ships with (defaultmodel.Calibration), and any other model falls
// back to the prompt length. The name says where the calibration came
// from ("" when there is none), and when it was made for a file of
// another size than the model's: a model replaced or requantized since
// answers differently, so its predictions are a stale guess.
func loadEstimator(path, modelPath string) (est *sched.Estimator, name string, err error) {
	explicit := path != ""
	if !explicit {
		path, _ = calibrationPath(modelPath) // "" without a config directory
	}
	if path != "" {
		c, err := sched.LoadCalibration(path)
		switch {
		case err == nil:
			name = path
			if st, err := os.Stat(modelPath); err == nil && c.ModelBytes > 0 && c.ModelBytes != st.Size() {
				name += fmt.Sprintf(" (made for a %d-byte model, this one has %d bytes: rerun tandem calibrate)", c.ModelBytes, st.Size())
			}
			return sched.NewEstimator(c), name, nil
		case explicit || !errors.Is(err, os.ErrNotExist):
			return nil, "", err
		}
	}
	if modelPath == "" {
		c, err := sched.ParseCalibration(defaultmodel.Calibration(), defaultmodel.CalibrationName)
		if err != nil {
			return nil, "", err
		}
		return sched.NewEstimator(c), defaultmodel.CalibrationName, nil
	}
	return sched.NewEstimator(nil), "", nil
}

// readPrompts reads text lines or JSON lines {"prompt", "max_tokens"}.
func readPrompts(path string, maxTokens int) ([]bench.WorkRequest, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var out []bench.WorkRequest
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 1
	for ; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		r := bench.WorkRequest{ID: fmt.Sprintf("p%05d", len(out)), Prompt: text, MaxTokens: maxTokens}
		if strings.HasPrefix(text, "{") {
			var j struct {
				Prompt    string `json:"prompt"`
				MaxTokens int    `json:"max_tokens"`
			}
			dec := json.NewDecoder(strings.NewReader(text))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&j); err != nil || j.Prompt == "" || j.MaxTokens < 0 {
				return nil, fmt.Errorf("%s:%d: want a text line or {\"prompt\": \"...\", \"max_tokens\": N}: %v", path, line, err)
			}
			r.Prompt = j.Prompt
			if j.MaxTokens > 0 {
				r.MaxTokens = min(j.MaxTokens, maxTokens)
			}
		}
		out = append(out, r)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("%s:%d: a line over 1 MiB; each prompt is one line, and must fit the model's context", path, line)
	} else if err != nil {
		return nil, err
	}
	if len(out) < 10 {
		return nil, fmt.Errorf("%s holds %d of the 10 prompts calibration needs at least (a few hundred is better)", path, len(out))
	}
	return out, nil
}

type calibrateOptions struct {
	lanes       []sched.LaneSpec
	temperature float64
	seed        uint64
	epochs      int
	maxTokens   int
	modelPath   string
}

// calibrate generates an answer to every prompt with the model (through
// the scheduler, batched, on every lane) and fits the estimator to the
// output lengths; a fifth of the prompts is held out for validation.
func calibrate(ctx context.Context, f *weights.File, tok *tokenizer.Tokenizer, prompts []bench.WorkRequest, opt calibrateOptions, stderr io.Writer) (*sched.Calibration, error) {
	lanes, closeLanes, err := sched.LoadLanes(f, sched.LaneOptions{Lanes: opt.lanes, MaxSeqs: 16, KVType: weights.F32})
	if err != nil {
		return nil, err
	}
	defer closeLanes()
	s, err := sched.New(sched.Config{Policy: sched.FIFO, MaxQueue: len(prompts) + 1}, nil, lanes...)
	if err != nil {
		return nil, err
	}
	defer s.Shutdown(context.Background())
	var streams []*sched.Stream
	var feats [][]float64
	for i, p := range prompts {
		ids, err := tok.Encode(p.Prompt, tokenizer.EncodeOptions{AddBOS: true})
		if err != nil {
			return nil, fmt.Errorf("prompt %d: %w", i, err)
		}
		if len(ids) >= s.Context() {
			return nil, fmt.Errorf("prompt %d has %d tokens, over the context of %d", i, len(ids), s.Context())
		}
		st, err := s.Submit(ctx, sched.Request{Prompt: ids, Text: p.Prompt, MaxTokens: p.MaxTokens,
			Sampling:   sample.Options{Temperature: float32(opt.temperature), Seed: opt.seed + uint64(i)},
			StopTokens: stopTokens(tok)})
		if err != nil {
			return nil, err
		}
		streams = append(streams, st)
		ft := sched.Extract(p.Prompt, len(ids))
		feats = append(feats, ft[:])
	}
	bar := progress.NewCount(stderr, "generate", uint64(len(streams)), "prompts")
	lengths := make([]float64, len(streams))
	for i, st := range streams {
		res, err := st.Wait(ctx)
		if err != nil {
			bar.Done()
			return nil, err
		}
		if res.Reason == sched.ReasonError || res.Reason == sched.ReasonCancelled {
			bar.Done()
			return nil, fmt.Errorf("generation %d: %v", i, res.Err)
		}
		lengths[i] = float64(res.TotalGenerated)
		bar.Set(uint64(i + 1))
	}
	bar.Done()

	// Shuffle, hold out a fifth, train, validate.
	idx := rand.New(rand.NewPCG(opt.seed, 7)).Perm(len(feats))
	nVal := max(len(idx)/5, 1)
	var trX, vaX [][]float64
	var trY, vaY []float64
	for k, i := range idx {
		if k < nVal {
			vaX, vaY = append(vaX, feats[i]), append(vaY, lengths[i])
		} else {
			trX, trY = append(trX, feats[i]), append(trY, lengths[i])
		}
	}
	if len(trX) < 8 {
		return nil, errors.New("too few prompts to train on; give at least 10")
	}
	// Many generations or epochs train for minutes: say what runs now.
	fmt.Fprintf(stderr, "training the estimator on %d generations, %d epochs\n", len(trX), opt.epochs)
	mlp, err := sched.TrainMLPContext(ctx, trX, trY, sched.TrainOptions{Epochs: opt.epochs, Seed: opt.seed})
	if err != nil {
		return nil, err
	}
	var mean float64
	for _, y := range trY {
		mean += y
	}
	mean /= float64(len(trY))
	var v sched.Validation
	v.N = len(vaX)
	var pred []float64
	for i, x := range vaX {
		p := mlp.Predict(x)
		pred = append(pred, p)
		v.MAE += math.Abs(p - vaY[i])
		// The fallback scores a prompt by its length in tokens; the
		// feature holds log1p(tokens)/log1p(scale).
		promptTokens := math.Expm1(x[sched.NumFeatures-1] * math.Log1p(sched.PromptLengthScale))
		v.FallbackMAE += math.Abs(promptTokens - vaY[i])
		v.MeanMAE += math.Abs(mean - vaY[i])
	}
	n := float64(len(vaX))
	v.MAE, v.FallbackMAE, v.MeanMAE = v.MAE/n, v.FallbackMAE/n, v.MeanMAE/n
	if len(pred) >= 2 {
		v.Spearman, _ = sched.Spearman(pred, vaY)
	}
	var scores []float64
	for _, x := range feats {
		scores = append(scores, mlp.Predict(x))
	}
	name := defaultModelName
	var size int64
	if opt.modelPath != "" {
		name = filepath.Base(opt.modelPath)
		if st, err := os.Stat(opt.modelPath); err == nil {
			size = st.Size()
		}
	}
	return &sched.Calibration{Format: sched.CalibrationFormat, Model: name, ModelBytes: size, Created: time.Now().UTC(),
		Samples: len(feats), MaxTokens: opt.maxTokens, Features: sched.FeatureNames[:], MLP: mlp,
		Scores: sched.Percentiles(scores), Validation: v}, nil
}

// onePerCore is a lane of one thread per physical core: the most
// throughput for many independent generations.
func onePerCore() []sched.LaneSpec {
	ones := make([]int, kernels.PhysicalCores())
	for i := range ones {
		ones[i] = 1
	}
	return sched.CPULaneSpecs(ones...)
}

// stopTokens are EOS and BOS (llama2.c models end a story with BOS).
func stopTokens(tok *tokenizer.Tokenizer) []int32 {
	var s []int32
	for _, id := range []int32{tok.EOS(), tok.BOS()} {
		if id >= 0 {
			s = append(s, id)
		}
	}
	return s
}
