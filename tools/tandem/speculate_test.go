package main

import (
	"encoding/json"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestGenerateSpeculative: every speculative mode runs from the command
// line, tree and sd give the model's own greedy tokens (with the weights
// resident and streamed under the smallest budget), and --json reports
// the speculative figures.
func TestGenerateSpeculative(t *testing.T) {
	target, draft, tok := testutil.Model(t, "stories260K.bin"), testutil.Model(t, "llama2xs_model.bin"), testutil.Model(t, "tok512.bin")
	base := []string{"generate", "--model", target, "--tokenizer", tok, "--ctx", "256", "--max-tokens", "40", "--json"}
	type result struct {
		IDs   []int32 `json:"ids"`
		Stats struct {
			Spec *struct {
				Mode          string  `json:"mode"`
				TargetPasses  int     `json:"target_passes"`
				DraftSteps    int     `json:"draft_steps"`
				TokensPerPass float64 `json:"tokens_per_target_pass"`
				Acceptance    float64 `json:"acceptance_rate"`
				DraftSeconds  float64 `json:"draft_seconds"`
				FreeRows      int     `json:"free_row_tokens_verified"`
				Undrafted     int     `json:"undrafted_passes"`
				Slides        int     `json:"draft_window_slides"`
			} `json:"speculative"`
			Stream *struct {
				Passes int `json:"passes"`
			} `json:"stream"`
			FirstToken float64 `json:"first_token_seconds"`
			Wall       float64 `json:"wall_seconds"`
		} `json:"stats"`
	}
	run := func(args ...string) result {
		t.Helper()
		code, out, errOut := tandem(t, append(append([]string(nil), base...), args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var r result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r
	}
	// Greedy, then sampled: with a seed, every lossless mode writes the
	// text the model alone draws with it, the timed trigger's included.
	for _, sampling := range [][]string{nil, {"--temperature", "0.8", "--top-p", "0.95", "--seed", "5"}} {
		want := run(sampling...).IDs
		for _, tc := range []struct {
			args  []string
			fills bool // the default trigger fills an IO-bound pass's free rows
		}{
			{[]string{"--draft", draft}, false},
			{[]string{"--draft", draft, "--no-pause"}, false},
			{[]string{"--draft", draft, "--mode", "sd", "--draft-len", "3"}, false},
			{[]string{"--draft", draft, "--mode", "tree", "--trigger", "adaptive", "--pacer", "uniform"}, false},
			{[]string{"--draft", draft, "--mode", "tree", "--trigger", "fixed", "--max-tree", "12", "--budget", "min", "--io-bandwidth", "200MB/s"}, false},
			{[]string{"--draft", draft, "--mode", "bild"}, false},
			// A draft window of 16 positions slides every few rounds.
			{[]string{"--draft", draft, "--draft-ctx", "16", "--no-pause"}, false},
			// Storage slow enough that every pass waits on IO whatever the
			// kernels and the machine's load (a pass reads about 1 MB), and
			// fast enough that drafting for its share of the wait leaves
			// the tree short of --max-tree: at 4 MB/s the trees reached
			// the cap, and some sampled runs had no row free to fill.
			{[]string{"--draft", draft, "--budget", "min", "--io-bandwidth", "8MB/s"}, true},
		} {
			args := append(append([]string(nil), tc.args...), sampling...)
			r := run(args...)
			sp := r.Stats.Spec
			if sp == nil || sp.TargetPasses == 0 || sp.DraftSteps == 0 || sp.TokensPerPass <= 1 {
				t.Errorf("%v: speculative stats %+v", args, sp)
				continue
			}
			if slides := slices.Contains(args, "--draft-ctx"); slides != (sp.Slides > 0) {
				t.Errorf("%v: the draft's window slid %d times; want it to slide only with --draft-ctx", args, sp.Slides)
			}
			if slices.Contains(args, "--no-pause") && sp.Undrafted != 0 {
				t.Errorf("%v: %d passes over the root alone; --no-pause drafts every round", args, sp.Undrafted)
			}
			if tc.fills != (sp.FreeRows > 0) {
				t.Errorf("%v: %d tokens verified in free rows; want them only from the default trigger on a streamed target", args, sp.FreeRows)
			}
			if sp.Mode != "bild" && !equalIDs(r.IDs, want) {
				t.Errorf("%v: ids differ from the model alone:\n got %v\nwant %v", args, r.IDs, want)
			}
		}
	}
	// The prompt rides with the first verification: the first token
	// costs one pass over the streamed weights, not a prefill's and then
	// a verification's.
	first := run("--draft", draft, "--budget", "min", "--io-bandwidth", "4MB/s", "--max-tokens", "1")
	if st := first.Stats; st.Stream == nil || st.Stream.Passes != 1 || st.FirstToken <= 0 || st.FirstToken > st.Wall {
		t.Errorf("one token from a streamed target: stream %+v, first token after %gs of %gs; want one pass and a time within the run", st.Stream, st.FirstToken, st.Wall)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "tree"}, "needs a draft model"},
		{[]string{"--draft", draft, "--mode", "std"}, "--draft needs --mode tree, sd or bild"},
		{[]string{"--draft", draft, "--trigger", "sometimes"}, "--trigger"},
		{[]string{"--draft", draft, "--branch-threshold", "0"}, "--branch-threshold"},
		{[]string{"--draft", draft, "--draft-ctx", "1"}, "--draft-ctx"},
		{[]string{"--draft", testutil.Model(t, "llama-2-tiny-random.gguf")}, "tokenizer"},
	} {
		code, _, errOut := tandem(t, append(append([]string(nil), base...), tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want an error mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
	// A GGUF target with its own vocabulary and a llama2.c draft without
	// one: the draft's tokenizer must be named.
	code, _, errOut := tandem(t, "generate", "--model", testutil.Model(t, "stories260K.gguf"), "--ctx", "256", "--max-tokens", "4", "--draft", draft)
	if code != 2 || !strings.Contains(errOut, "pass --draft-tokenizer") {
		t.Errorf("llama2.c draft for a GGUF target: exit %d, %q; want a usage error asking for --draft-tokenizer", code, errOut)
	}
	// A draft tokenizer of another size than the draft's vocabulary.
	code, _, errOut = tandem(t, "generate", "--model", testutil.Model(t, "stories260K.gguf"), "--ctx", "256", "--max-tokens", "4", "--draft", draft,
		"--draft-tokenizer", testutil.Model(t, "tokenizer.bin"))
	if code != 2 || !strings.Contains(errOut, "do not belong together") || !strings.Contains(errOut, "--draft-tokenizer") {
		t.Errorf("llama2.c draft with another model's tokenizer: exit %d, %q; want a usage error naming --draft-tokenizer", code, errOut)
	}
}

// TestSpecFlagMethodsCoverTheFlags: every flag addSpecFlags makes but
// --draft itself says which methods it tunes, so a new flag cannot be
// silently ignored by a run that does not use it.
func TestSpecFlagMethodsCoverTheFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	addSpecFlags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := specFlagMethods[f.Name]; !ok && f.Name != "draft" {
			t.Errorf("--%s has no entry in specFlagMethods", f.Name)
		}
	})
	for name := range specFlagMethods {
		if fs.Lookup(name) == nil {
			t.Errorf("specFlagMethods names --%s, which addSpecFlags does not make", name)
		}
	}
}
