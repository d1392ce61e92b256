package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Class is a kind of client in the scheduling workload.
type Class int

const (
	// Planner: a robot planner asking for one short step, with a tight
	// deadline and a high utility.
	Planner Class = iota
	// Chat: a chat UI, normal answers; some carry a loose deadline.
	Chat
	// Summary: a background summary, long, low utility, with a
	// mandatory part (min_tokens) and an optional rest.
	Summary
	// Adversarial: an open-ended prompt that runs very long.
	Adversarial
)

var classNames = [...]string{"planner", "chat", "summary", "adversarial"}

func (c Class) String() string { return classNames[c] }

// Variance is how much output lengths spread within a class.
type Variance int

const (
	VarianceSmall  Variance = iota // ±10%
	VarianceNormal                 // ±40%
	VarianceLarge                  // log-normal, σ = 1 (a heavy tail)
)

var varianceNames = [...]string{"small", "normal", "large"}

func (v Variance) String() string { return varianceNames[v] }

// ParseVariance reads small, normal or large.
func ParseVariance(s string) (Variance, error) {
	for i, n := range varianceNames {
		if s == n {
			return Variance(i), nil
		}
	}
	return 0, fmt.Errorf("variance %q: want small, normal or large", s)
}

// WorkloadConfig describes one benchmark run's requests.
type WorkloadConfig struct {
	Requests    int
	Rate        float64 // Poisson arrivals per second
	Adversarial float64 // share of adversarial prompts, 0..1
	Variance    Variance
	// TokenTime is the engine's measured time per decoded token for one
	// sequence; deadlines are set in multiples of it so that they mean
	// the same on a fast and a slow engine.
	TokenTime time.Duration
	// MaxTokens caps every request (the context minus the prompt).
	MaxTokens int
	Seed      uint64
}

// WorkRequest is one request of a workload.
type WorkRequest struct {
	ID        string
	Class     Class
	Arrival   time.Duration // since the start
	Prompt    string
	MaxTokens int
	MinTokens int           // 0: all mandatory
	Deadline  time.Duration // 0: none
	Utility   float64
	// Natural is how long the answer would run if max_tokens allowed
	// (the simulator's EOS; the real engine ignores it).
	Natural int
}

// classMix is the share of each class among non-adversarial requests.
var classMix = [...]float64{Planner: 0.35, Chat: 0.45, Summary: 0.20}

// classTokens is each class's typical max_tokens.
var classTokens = [...]int{Planner: 16, Chat: 64, Summary: 192, Adversarial: 448}

// Workload generates a run's requests: Poisson arrivals, a class per
// request, a prompt from the class's workTemplates and the class's length,
// deadline and utility.
func Workload(cfg WorkloadConfig) []WorkRequest {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc0ffee))
	out := make([]WorkRequest, 0, cfg.Requests)
	var at time.Duration
	for i := range cfg.Requests {
		if cfg.Rate > 0 {
			at += time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second))
		}
		r := workRequest(rng, cfg, pickClass(rng, cfg.Adversarial))
		r.ID = fmt.Sprintf("r%05d", i)
		r.Arrival = at
		out = append(out, r)
	}
	return out
}

func pickClass(rng *rand.Rand, adversarial float64) Class {
	if rng.Float64() < adversarial {
		return Adversarial
	}
	x := rng.Float64()
	for c, share := range classMix {
		if x < share {
			return Class(c)
		}
		x -= share
	}
	return Chat
}

// spread scales a class length by the variance setting.
func workSpread(rng *rand.Rand, v Variance, n int) int {
	var f float64
	switch v {
	case VarianceSmall:
		f = 0.9 + 0.2*rng.Float64()
	case VarianceNormal:
		f = 0.6 + 0.8*rng.Float64()
	default:
		f = math.Exp(rng.NormFloat64() - 0.5) // median e^-0.5, mean 1
	}
	return max(2, int(math.Round(float64(n)*f)))
}

func workRequest(rng *rand.Rand, cfg WorkloadConfig, c Class) WorkRequest {
	r := WorkRequest{Class: c, Prompt: workPrompt(rng, c)}
	r.MaxTokens = workSpread(rng, cfg.Variance, classTokens[c])
	if cfg.MaxTokens > 0 {
		r.MaxTokens = min(r.MaxTokens, cfg.MaxTokens)
	}
	// The model ends its answer early about a third of the time.
	r.Natural = r.MaxTokens
	if rng.Float64() < 0.3 {
		r.Natural = max(1, int(float64(r.MaxTokens)*(0.3+0.6*rng.Float64())))
	}
	tok := cfg.TokenTime
	if tok <= 0 {
		tok = time.Millisecond
	}
	switch c {
	case Planner:
		// A step the robot needs soon: 6× its own decode time at light
		// load, plus a little for the prompt.
		r.Deadline = time.Duration(6*r.MaxTokens+20) * tok
		r.Utility = 2
	case Chat:
		r.Utility = 1
		if rng.Float64() < 0.3 {
			r.Deadline = time.Duration(8*r.MaxTokens+40) * tok
		}
	case Summary:
		r.Utility = 0.3
		r.MinTokens = max(1, r.MaxTokens/4)
	case Adversarial:
		r.Utility = 0.5
	}
	return r
}

// Prompt workTemplates per class, filled with random workNouns. They carry the
// linguistic cues the uncertainty features look for: planners ask
// closed, single questions; chats ask for a short story; summaries and
// adversarial prompts are open-ended, vague and multi-part.
var workTemplates = [...][]string{
	Planner: {
		"What is the next step for the %s?",
		"Is the %s near the %s?",
		"Where is the %s?",
		"Name the color of the %s.",
		"Which %s is closer?",
		"Move to the %s.",
	},
	Chat: {
		"Tell me a story about a %s and a %s.",
		"Once upon a time there was a %s who found a %s.",
		"Write a short story about the %s.",
		"Lily had a %s. One day she saw a %s.",
	},
	Summary: {
		"Summarize everything about the %s and the %s, and then describe what happened to them in detail.",
		"Write a long story about a %s. First describe the %s, then explain why things changed, and also tell what happened next.",
		"Describe the %s and the %s in detail, with some of the various things they did, etc.",
	},
	Adversarial: {
		"Tell me everything about the %s and the %s, and keep going, step by step, as long as you can, and never stop.",
		"Imagine an endless story about the %s: describe every detail, explain why, then continue with the %s, and so on forever.",
		"Write a very long story about the %s and the %s, chapter after chapter, and then keep going with more ideas.",
	},
}

var workNouns = []string{"ball", "dog", "cat", "box", "tree", "car", "bird", "cup", "door", "boat", "robot", "girl",
	"boy", "park", "flower", "fish", "cake", "hat", "book", "sun", "moon", "star", "frog", "bear"}

func workPrompt(rng *rand.Rand, c Class) string {
	t := workTemplates[c][rng.IntN(len(workTemplates[c]))]
	n := strings.Count(t, "%s")
	args := make([]any, n)
	for i := range args {
		args[i] = workNouns[rng.IntN(len(workNouns))]
	}
	return fmt.Sprintf(t, args...)
}

// CalibrationPrompts returns n prompts with a class mix like the
// workload's (a fifth adversarial) and each one's max_tokens: the corpus
// `tandem calibrate` generates from when no prompt file is given.
func CalibrationPrompts(n int, variance Variance, maxTokens int, seed uint64) []WorkRequest {
	return Workload(WorkloadConfig{Requests: n, Adversarial: 0.2, Variance: variance, MaxTokens: maxTokens, Seed: seed})
}
