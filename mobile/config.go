package mobile

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/tandem-llm/tandem/internal/budget"
	"github.com/tandem-llm/tandem/internal/sysmem"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// config is NewEngine's JSON. Every field is optional: "{}" (or "") runs
// the embedded default model on one lane of kernels.DefaultThreads.
type config struct {
	// Model is the GGUF (or llama2.c .bin) file, an absolute path in the
	// app's private storage; empty: the embedded default model.
	Model string `json:"model"`
	// Tokenizer is a tokenizer.bin or GGUF vocabulary (empty: the
	// model's own; llama2.c models need one).
	Tokenizer string `json:"tokenizer"`
	// Draft is a draft model for speculative decoding: every lane then
	// decodes with it, with the model's own output ("default": the
	// embedded draft). Its vocabulary must be the model's: its own, or
	// DraftTokenizer, or Tokenizer for a llama2.c draft.
	Draft          string `json:"draft"`
	DraftTokenizer string `json:"draft_tokenizer"`
	// Mode is how the draft is used: "tree" (default) or "sd".
	Mode string `json:"mode"`
	// DraftContext caps the draft's KV positions per sequence (0: its
	// own context): past them it drafts from the latest tokens, which
	// saves memory for weaker guesses, the output unchanged.
	DraftContext int `json:"draft_context"`
	// Calibration is the uncertainty estimator (empty: MODEL.calib.json
	// when it exists, else the prompt length; the embedded model's own
	// for the embedded model).
	Calibration string `json:"calibration"`
	// Budget is the most bytes of weights the lanes hold (see
	// internal/budget): "" keeps the whole (mapped) file, "auto" takes
	// autoShare of available memory, "min" the smallest the model
	// allows, a size like "512MiB" is split among the lanes, and "25%"
	// is a share of the weights each lane holds.
	Budget string `json:"budget"`
	// Threads is the kernel threads of a single lane (0:
	// kernels.DefaultThreads, a thread per big core on a phone); Lanes
	// gives one entry per lane instead.
	Threads int   `json:"threads"`
	Lanes   []int `json:"lanes"`
	// LaneCPUs pins each lane to CPUs: "big" (every core but the slowest
	// cluster's), "little" (the slowest cluster), a CPU list like "4-7",
	// or "" (placed by the OS). One entry per lane.
	LaneCPUs []string `json:"lane_cpus"`
	// Context is the tokens per sequence (0: the model's).
	Context int `json:"context"`
	// MaxSeqs is the sequence slots per lane, running and parked.
	MaxSeqs int `json:"max_seqs"`
	// MaxBatch is the most sequences a lane decodes together.
	MaxBatch int `json:"max_batch"`
	// MaxTokens bounds requests that do not set max_tokens.
	MaxTokens int `json:"max_tokens"`
	// MaxQueue is how many requests may wait for a lane; Generate fails
	// with "queue full" beyond it (retry after a moment).
	MaxQueue int `json:"max_queue"`
	// KVType is "f32" (default) or "f16" (half the KV memory).
	KVType string `json:"kv_type"`
	// Policy is the scheduling policy (tandem, fifo, luf, edf, rtlm).
	Policy string `json:"policy"`
	// PrefixReuse (default true) starts a request from a finished one's
	// KV rows where their contexts share a prefix, as a chat's next turn
	// does (see sched.ModelEngine); false prefills every prompt whole.
	PrefixReuse *bool `json:"prefix_reuse"`
	// PrefixCache is the KV memory a lane may fill with finished
	// requests' rows kept for prefix reuse, a size like "256MiB" (the
	// default); "0" keeps only the slots live requests took.
	PrefixCache string `json:"prefix_cache"`
}

// Defaults sized for a phone: an app runs a few generations at once, and
// every sequence slot's KV memory counts against the app.
const (
	defaultMaxSeqs   = 8
	defaultMaxBatch  = 4
	defaultMaxTokens = 256
	defaultMaxQueue  = 256
	// defaultPrefixCache keeps a few conversations of a small model, and
	// none beyond the live sequences of a large one.
	defaultPrefixCache = "256MiB"
	maxLanes           = 8
)

// autoShare is the share of available memory budget "auto" gives the
// weights, less than the CLI's: Android's low-memory killer ends apps
// that grow too far, and the app's own heap, the KV cache and the
// activations need the rest.
const autoShare = 0.5

// availableMemory reports the memory budget "auto" divides (a test seam).
var availableMemory = sysmem.Available

// lanes returns the lanes to load: threads and CPUs of each.
func (c *config) lanes() ([]sched.LaneSpec, error) {
	threads, err := c.laneThreads()
	if err != nil {
		return nil, err
	}
	// lane_cpus alone makes a lane per entry, a thread per CPU.
	alone := len(c.Lanes) == 0 && c.Threads == 0 && len(c.LaneCPUs) > 0
	if alone {
		if len(c.LaneCPUs) > maxLanes {
			return nil, fmt.Errorf("lane_cpus %q: at most %d lanes", c.LaneCPUs, maxLanes)
		}
		threads = slices.Repeat(threads, len(c.LaneCPUs))
	}
	specs := sched.CPULaneSpecs(threads...)
	if len(c.LaneCPUs) == 0 {
		return specs, nil
	}
	if len(c.LaneCPUs) != len(specs) {
		return nil, fmt.Errorf("lane_cpus %q: %d entries for %d lane(s); give one per lane (\"\" for a lane the OS places)", c.LaneCPUs, len(c.LaneCPUs), len(specs))
	}
	for i, name := range c.LaneCPUs {
		if name == "" {
			continue
		}
		cpus, err := namedCPUs(name)
		if err != nil {
			return nil, fmt.Errorf("lane_cpus[%d] %q: %w", i, name, err)
		}
		if alone {
			specs[i].Threads = 0 // one per CPU
		}
		specs[i].CPUs = cpus
		if err := specs[i].Check(); err != nil {
			return nil, fmt.Errorf("lane_cpus[%d] %q: %w", i, name, err)
		}
		specs[i].Threads = specs[i].ThreadCount()
	}
	return specs, nil
}

// namedCPUs resolves lane_cpus entries (a test seam: tests name a
// phone's clusters).
var namedCPUs = cpuset.Named

// laneThreads returns the threads of each lane.
func (c *config) laneThreads() ([]int, error) {
	switch {
	case len(c.Lanes) > 0 && c.Threads != 0:
		return nil, fmt.Errorf("threads %d and lanes %v: give threads (one lane) or lanes (threads per lane), not both", c.Threads, c.Lanes)
	case len(c.Lanes) > maxLanes:
		return nil, fmt.Errorf("lanes %v: at most %d lanes", c.Lanes, maxLanes)
	case len(c.Lanes) > 0:
		for i, n := range c.Lanes {
			if n < 1 || n > sched.MaxLaneThreads {
				return nil, fmt.Errorf("lanes[%d] = %d: want 1..%d threads", i, n, sched.MaxLaneThreads)
			}
		}
		return c.Lanes, nil
	case c.Threads < 0 || c.Threads > sched.MaxLaneThreads:
		return nil, fmt.Errorf("threads %d: want 1..%d (0: a thread per big core, or per core where they are alike)", c.Threads, sched.MaxLaneThreads)
	case c.Threads > 0:
		return []int{c.Threads}, nil
	}
	return []int{kernels.DefaultThreads()}, nil
}

// check validates the fields that need no files.
func (c *config) check() error {
	switch {
	case c.Mode != "" && c.Mode != "tree" && c.Mode != "sd":
		return fmt.Errorf("mode %q: want tree or sd", c.Mode)
	case c.Mode != "" && c.Draft == "":
		return fmt.Errorf("mode %q needs a draft", c.Mode)
	case c.DraftTokenizer != "" && c.Draft == "":
		return errors.New("draft_tokenizer needs a draft")
	case c.DraftContext != 0 && c.Draft == "":
		return errors.New("draft_context needs a draft")
	case c.Context < 0 || c.Context > 0 && c.Context < sched.MinContext:
		return fmt.Errorf("context %d: want 0 (the model's) or at least %d, for a prompt and its answer", c.Context, sched.MinContext)
	case c.MaxSeqs < 0 || c.MaxSeqs > 1024:
		return fmt.Errorf("max_seqs %d: want 1..1024 (0: %d)", c.MaxSeqs, defaultMaxSeqs)
	case c.MaxBatch < 0 || c.MaxBatch > 256:
		return fmt.Errorf("max_batch %d: want 1..256 (0: %d)", c.MaxBatch, defaultMaxBatch)
	case c.MaxTokens < 0:
		return fmt.Errorf("max_tokens %d is negative (0: %d)", c.MaxTokens, defaultMaxTokens)
	case c.MaxQueue < 0 || c.MaxQueue > 100000:
		return fmt.Errorf("max_queue %d: want 1..100000 (0: %d)", c.MaxQueue, defaultMaxQueue)
	}
	if err := spec.CheckDraftContext(c.DraftContext); err != nil {
		return fmt.Errorf("draft_context %w", err)
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = defaultMaxSeqs
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = defaultMaxQueue
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = defaultMaxTokens
	}
	if c.Policy == "" {
		c.Policy = "tandem"
	}
	if c.KVType == "" {
		c.KVType = "f32"
	}
	if c.PrefixCache == "" {
		c.PrefixCache = defaultPrefixCache
	}
	return nil
}

// prefixCache reads prefix_cache.
func (c *config) prefixCache() (int64, error) {
	n, err := sched.ParsePrefixCache(c.PrefixCache)
	if err != nil {
		return 0, fmt.Errorf("prefix_cache %q: %w", c.PrefixCache, err)
	}
	return n, nil
}

// kvType reads kv_type.
func (c *config) kvType() (weights.DType, error) {
	t, err := weights.ParseDType(c.KVType)
	if err != nil || (t != weights.F32 && t != weights.F16) {
		return 0, fmt.Errorf("kv_type %q: want f32 or f16", c.KVType)
	}
	return t, nil
}

// openModel opens the model file, or the embedded default for "".
func openModel(path string) (*weights.File, error) {
	if path == "" {
		return defaultmodel.Target()
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("model %q: %w; copy the model into the app's files directory (Context.getFilesDir()) and pass its absolute path, or leave model empty for the embedded default", path, err)
	}
	f, err := weights.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", path, err)
	}
	return f, nil
}

// openTokenizer reads the tokenizer file, or the model's own vocabulary.
func openTokenizer(f *weights.File, path string) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizer.ForModel(f, path)
	switch {
	case errors.Is(err, tokenizer.ErrNoVocabulary):
		return nil, fmt.Errorf("%v: set tokenizer", err)
	case errors.Is(err, tokenizer.ErrWrongVocabulary):
		return nil, fmt.Errorf("%v: set tokenizer to the model's own, or leave it out for a GGUF's own vocabulary", err)
	case err != nil && path != "":
		return nil, fmt.Errorf("tokenizer %q: %w", path, err)
	}
	return tok, err
}

// openEstimator reads the calibration, explicit or beside the model;
// the embedded model has the one it ships with.
func openEstimator(path, modelPath string) (*sched.Estimator, error) {
	if path == "" && modelPath != "" {
		if def := sched.CalibrationPath(modelPath); fileExists(def) {
			path = def
		}
	}
	if path == "" && modelPath == "" {
		c, err := sched.ParseCalibration(defaultmodel.Calibration(), defaultmodel.CalibrationName)
		if err != nil {
			return nil, err
		}
		return sched.NewEstimator(c), nil
	}
	if path == "" {
		return sched.NewEstimator(nil), nil
	}
	c, err := sched.LoadCalibration(path)
	if err != nil {
		return nil, fmt.Errorf("calibration %q: %w", path, err)
	}
	return sched.NewEstimator(c), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// planMemory resolves the budget for lanes lanes over f (see
// internal/budget).
func planMemory(f *weights.File, b string, lanes int) (budget.Plan, error) {
	return budget.ForLanes(f, b, lanes, budget.Options{AutoShare: autoShare, Available: availableMemory, Embedded: defaultmodel.IsEmbedded(f)})
}

// specConfig is the speculative configuration of mode, with spec's
// defaults (those of tandem generate --draft): a lane whose target
// streams keeps drafting while it waits for weights.
func specConfig(mode string) spec.Config {
	if mode == "sd" {
		return spec.Config{Method: spec.SD, Pipeline: true}
	}
	return spec.Config{Method: spec.Tree, Pipeline: true}
}

// openDraft opens the draft and checks that it shares the model's
// vocabulary tok.
func openDraft(c *config, tok *tokenizer.Tokenizer, modelName string) (*weights.File, error) {
	var f *weights.File
	var err error
	switch c.Draft {
	case "default":
		f, err = defaultmodel.Draft()
	default:
		if _, err = os.Stat(c.Draft); err == nil {
			f, err = weights.Open(c.Draft)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("draft %q: %w", c.Draft, err)
	}
	if err := spec.CheckDraftFile(f, c.DraftTokenizer, c.Tokenizer, tok, modelName); err != nil {
		f.Close()
		if errors.Is(err, tokenizer.ErrNoVocabulary) {
			return nil, fmt.Errorf("draft: %v: set draft_tokenizer", err)
		}
		return nil, fmt.Errorf("draft: %w", err)
	}
	return f, nil
}
