package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/corpus"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

// tandem runs the CLI in-process and returns exit code, stdout, stderr.
func tandem(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpAndUsage(t *testing.T) {
	for name := range verbs {
		args := []string{name, "--help"}
		if name == "bench" {
			args = []string{"bench", "decode", "--help"}
		}
		code, out, _ := tandem(t, args...)
		if code != 0 || !strings.Contains(out, "Usage: tandem "+name) {
			t.Errorf("%s --help: exit %d, output %q", name, code, out)
		}
	}
	if code, _, errOut := tandem(t, "frobnicate"); code != 2 || !strings.Contains(errOut, "unknown command") {
		t.Errorf("unknown verb: exit %d, %q", code, errOut)
	}
	// A bad flag is one line on stderr, not the help on stdout.
	if code, out, errOut := tandem(t, "inspect", "--bogus", "x"); code != 2 || out != "" || strings.Count(errOut, "bogus") != 1 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("bad flag: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := tandem(t, "inspect"); code != 2 || !strings.Contains(errOut, "want 1 argument") {
		t.Errorf("missing argument: exit %d, %q", code, errOut)
	}
	if code, _, errOut := tandem(t, "generate", "Once upon a time"); code != 2 || !strings.Contains(errOut, `"Once upon a time"`) || !strings.Contains(errOut, "--prompt") {
		t.Errorf("a prompt as an argument: exit %d, %q; want a pointer to --prompt", code, errOut)
	}
	// Sampling and speculative values out of range are usage errors
	// before anything loads (--min-p 2 used to panic in the draft's
	// sampler; --trigger bogus without a draft passed unseen).
	for _, bad := range [][]string{{"--min-p", "2"}, {"--temperature", "-1"}, {"--top-p", "2"}, {"--top-k", "-3"},
		{"--repeat-penalty", "0"}, {"--threads", "-2"}, {"--max-tokens", "-5"}, {"--trigger", "bogus"}, {"--max-tree", "0"},
		{"--branch-threshold", "NaN"}, {"--temperature", "NaN"}, {"--threads", "100000"}, {"--max-tree", "100000000"}} {
		code, out, errOut := tandem(t, append([]string{"generate", "--temperature", "1"}, bad...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, bad[0]) || !strings.Contains(errOut, bad[1]) {
			t.Errorf("generate %v: exit %d, stdout %q, stderr %q", bad, code, out, errOut)
		}
	}
	if code, out, _ := tandem(t, "version"); code != 0 || !strings.HasPrefix(out, "tandem ") {
		t.Errorf("version: %d %q", code, out)
	}
	if code, _, _ := tandem(t, "version", "extra"); code != 2 {
		t.Errorf("version with an argument: exit %d, want 2", code)
	}
	short := filepath.Join(t.TempDir(), "short.txt")
	if err := os.WriteFile(short, []byte("Once upon a time there was a cat.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := tandem(t, "eval", "--model", testutil.Model(t, "stories260K.gguf"), "--data", short); code != 1 || !strings.Contains(errOut, "fewer than one window of 257 (--ctx 256 + 1)") || strings.Contains(errOut, "train:") {
		t.Errorf("eval of a short text: exit %d, %q; want 1 naming --ctx", code, errOut)
	}
	if code, _, errOut := tandem(t, "bench", "bogus"); code != 2 || !strings.Contains(errOut, `unknown benchmark "bogus"`) {
		t.Errorf("bench bogus: exit %d, %q; want 2 naming the unknown benchmark", code, errOut)
	}
}

func TestFlagsAreCheckedBeforeAnyWork(t *testing.T) {
	// Caught before any work: calibrate's output used to fail at the end.
	gguf := testutil.Model(t, "stories260K.gguf")
	farPrompt := filepath.Join(t.TempDir(), "far.jsonl")
	if err := os.WriteFile(farPrompt, []byte(`{"prompt_ids":[1,99999]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"calibrate", "--model", gguf, "--out", t.TempDir()},
		{"calibrate", "--model", gguf, "--out", filepath.Join(t.TempDir(), "missing", "c.json")},
		{"bench", "decode", "--runs", "0"},
		{"bench", "decode", "--gen", "-1"},
		// Checked before the bandwidth probe and before any synthesis.
		{"bench", "decode", "--shape", "bogus"},
		{"bench", "decode", "--types", "q4_0,q4_k"},
		{"bench", "stream", "--from", gguf, "--types", "q4_0,q4_k"},
		{"bench", "spec", "--from", gguf, "--shape", "bogus"},
		// Flags that were ignored in these combinations.
		{"inspect", "--full", gguf},
		{"corpus", "--size", "1KB", "--stories", "3", filepath.Join(t.TempDir(), "c.txt")},
		{"distill", "--target", gguf, "--out", filepath.Join(t.TempDir(), "d.gguf"), "--temperature", "-1"},
		{"synth", "--shape", "stories15m", "--ctx", "-5", filepath.Join(t.TempDir(), "s.gguf")},
		{"inflate", "--from", gguf, "--shape", "stories15m", "--ctx", "-5", filepath.Join(t.TempDir(), "i.gguf")},
		{"synth", "--shape", "stories15m", "--ctx", "2000000000", filepath.Join(t.TempDir(), "s.gguf")},
		{"inflate", "--from", gguf, "--shape", "stories110m", "--ctx", "2000000000", filepath.Join(t.TempDir(), "i.gguf")},
		// A shape the source does not fit, found at planning (exit 1).
		{"inflate", "--from", gguf, "--shape", "stories15m", filepath.Join(t.TempDir(), "i.gguf")},
		{"bench", "stream", "--from", gguf, "--shape", "stories15m", "--modes", "resident", "--plots", ""},
		{"serve", "--ctx", "-5"},
		{"serve", "--ctx", "2"},
		{"serve", "--model", gguf, "--ctx", "100000"}, // said after listening, with exit 1
		{"serve", "--ctx", "100000"},
		{"serve", "--drain-timeout", "-5s"},
		{"serve", "--park-ttl", "0s"},
		{"serve", "--prefix-cache", "-5MiB"},
		{"serve", "--prefix-cache", "lots"},
		// A budget's form is checked before serve listens.
		{"serve", "--budget", "bogus"},
		{"serve", "--budget", "5%"}, // the embedded model cannot stream
		{"serve", "--model", gguf, "--budget", "0%"},
		{"serve", "--model", gguf, "--budget", "min", "--io-bandwidth", "1B/s"},
		// Tuning flags the run's decoding would ignore, and values that
		// failed later (exit 1) in the model's or the decoder's words.
		{"generate", "--model", gguf, "--draft-len", "3"},
		{"generate", "--mode", "target", "--max-tree", "4"},
		{"generate", "--draft-len", "3"}, // the embedded pair decodes with a tree
		{"generate", "--trigger", "fixed", "--alpha", "0.5"},
		{"generate", "--trigger", "adaptive", "--no-pause"},
		{"generate", "--mode", "sd", "--max-tree", "3", "--model", gguf, "--draft", gguf},
		{"generate", "--mode", "bild", "--rollback", "-1", "--model", gguf, "--draft", gguf},
		{"generate", "--mode", "bild", "--fallback", "5", "--model", gguf, "--draft", gguf},
		{"generate", "--model", gguf, "--top-k", "5"}, // greedy: sampling's flags change nothing
		{"generate", "--top-p", "0.5"},
		{"generate", "--min-p", "0.1", "--temperature", "0"},
		{"generate", "--seed", "9"},
		{"generate", "--prompt", "a\xffb"}, // failed at encoding, exit 1
		// distill panicked on --seq 0 and read --temperature 0 as 1; the
		// training numbers failed only after the data was read, exit 1.
		{"distill", "--target", gguf, "--out", filepath.Join(t.TempDir(), "d.gguf"), "--seq", "0", "--steps", "1"},
		{"distill", "--target", gguf, "--out", filepath.Join(t.TempDir(), "d.gguf"), "--temperature", "0", "--steps", "1"},
		{"distill", "--target", gguf, "--out", filepath.Join(t.TempDir(), "d.gguf"), "--lr", "0", "--steps", "1"},
		{"train", "--data", gguf, "--vocab", gguf, "--out", filepath.Join(t.TempDir(), "m.gguf"), "--steps", "1", "--min-lr", "1"},
		{"train", "--data", gguf, "--vocab", gguf, "--out", filepath.Join(t.TempDir(), "m.gguf"), "--steps", "1", "--clip", "NaN"},
		{"train", "--data", gguf, "--vocab", gguf, "--out", filepath.Join(t.TempDir(), "m.gguf"), "--steps", "1", "--warmup", "-1"},
		{"train", "--data", gguf, "--vocab", gguf, "--out", filepath.Join(t.TempDir(), "m.gguf"), "--steps", "1", "--tokens", "1000"},
		{"train", "--data", gguf, "--vocab", gguf, "--out", filepath.Join(t.TempDir(), "m.gguf"), "--steps", "1", "--valid", gguf, "--valid-frac", "0.5"},
		{"corpus", "--stories", "3", "--vocab", "10", filepath.Join(t.TempDir(), "c.txt")},
		{"corpus", "--stories", "3", "--vocab-out", filepath.Join(t.TempDir(), "v.gguf"), filepath.Join(t.TempDir(), "c.txt")},
		{"corpus", "--from", gguf, "--stories", "3", "--vocab", "300"},
		{"corpus", "--stories", "3", "--first", "-1", filepath.Join(t.TempDir(), "c.txt")},
		{"synth", "--dims", "64,172,4,8,4,100", filepath.Join(t.TempDir(), "s.gguf")}, // no room for 256 byte tokens
		{"calibrate", "--model", gguf, "--temperature", "50"},
		{"bench", "decode", "--model", testutil.Model(t, "llama2xs_model.bin")}, // 512 + 32 tokens, a context of 256
		{"generate", "--ctx", "-5"},
		{"generate", "--ctx", "100000"},
		{"generate", "--device", "tpu"},
		{"serve", "--max-tree", "4"}, // no draft
		// A draft without its vocabulary, or with another model's, was
		// said after listening.
		{"serve", "--model", gguf, "--draft", testutil.Model(t, "llama2xs_model.bin")},
		{"serve", "--model", gguf, "--draft", testutil.Model(t, "llama2xs_model.bin"), "--draft-tokenizer", testutil.Model(t, "tokenizer.bin")},
		{"serve", "--draft", gguf, "--mode", "sd", "--max-tree", "4"},
		{"bench", "stream", "--model", gguf, "--types", "f16"},
		{"bench", "stream", "--model", gguf, "--modes", "resident", "--budgets", "50"}, // nothing streams
		{"bench", "spec", "--from", gguf, "--draft", gguf, "--prompts", "p.jsonl", "--modes", "std,sd", "--max-tree", "4"},
		{"bench", "spec", "--from", gguf, "--draft", gguf, "--prompts", "p.jsonl", "--modes", "tree", "--sd-lens", "3"},
		{"bench", "stream", "--model", gguf, "--shape", "stories15m"},
		{"bench", "decode", "--model", gguf, "--types", "q8_0"},
		// bench spec found these after measuring the target alone.
		{"bench", "spec", "--from", gguf, "--draft", testutil.Model(t, "llama-2-tiny-random.gguf"), "--prompts", testutil.Testdata(t, "stories260K.greedy.jsonl"), "--shape", "stories15m"},
		{"bench", "spec", "--from", gguf, "--draft", gguf, "--prompts", farPrompt, "--shape", "stories15m"},
		{"eval", "--data", gguf, "--ctx", "0"},
		{"eval", "--data", gguf, "--windows", "-1"},
		{"eval", "--prompts", gguf, "--draft", gguf, "--gen", "0"}, // measured one token, saying "up to 0"
		// NaN passes a check written as x < lo || x > hi.
		{"bench", "sched", "--real=false", "--loads", "NaN"},
		{"bench", "sched", "--real=false", "--sim-requests", "2000000000"},
		// A typo of 100000 threads started as many spinning workers.
		{"eval", "--threads", "100000"},
		{"train", "--threads", "257"},
		{"distill", "--threads", "-1"},
		{"bench", "stream", "--threads", "100000"},
		{"bench", "spec", "--threads", "100000"},
		{"bench", "decode", "--threads", "1,300"},
		{"bench", "sched", "--real=false", "--sim-threads", "100000"},
		{"bench", "sched", "--real=false", "--sim-threads", "0"},
		{"bench", "sched", "--real=false", "--adversarial", "0,NaN"},
		{"bench", "sched", "--real=false", "--sim-costs", "NaN,1,1"},
		{"bench", "spec", "--from", gguf, "--draft", gguf, "--prompts", "p.jsonl", "--budgets", "NaN"},
		{"bench", "spec", "--from", gguf, "--draft", gguf, "--prompts", "p.jsonl", "--branch-threshold", "NaN"},
		{"generate", "--trigger", "adaptive", "--alpha", "NaN"},
		{"calibrate", "--model", gguf, "--temperature", "NaN"},
		{"calibrate", "--model", gguf, "--n", "2000000000"},
		{"distill", "--target", gguf, "--out", filepath.Join(t.TempDir(), "d.gguf"), "--temperature", "NaN"},
		// K types are read, not written.
		{"convert", "--type", "q4_k", gguf, filepath.Join(t.TempDir(), "k.gguf")},
		// A llama2.c model has no vocabulary to tokenize with.
		{"tokenize", "--model", testutil.Model(t, "stories260K.bin"), "hi"},
	} {
		if code, out, errOut := tandem(t, args...); code != 2 || out != "" || strings.Contains(errOut, "listening") {
			t.Errorf("%v: exit %d (%q), output %q; want 2 and no output, before listening", args, code, errOut, out)
		}
	}
	// A model that is not there is not a usage error, but is as early.
	missing := filepath.Join(t.TempDir(), "missing.gguf")
	if code, out, errOut := tandem(t, "bench", "decode", "--model", missing); code != 1 || out != "" || !strings.Contains(errOut, "missing.gguf") {
		t.Errorf("bench decode of a missing model: exit %d (%q), output %q; want 1 naming the file, no output", code, errOut, out)
	}
}

// TestBenchDecode measures a real model: a row per thread count, 0 being
// a thread per core, with the medians the help promises.
func TestBenchDecode(t *testing.T) {
	code, out, errOut := tandem(t, "bench", "decode", "--model", testutil.Model(t, "stories260K.gguf"), "--threads", "0,1",
		"--runs", "3", "--prompt", "16", "--gen", "4")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	row := regexp.MustCompile(`(?m)^\| F32 \| (\d+) \| [0-9.]+ \| [0-9.]+ \([0-9.]+-[0-9.]+\) \|`)
	rows := row.FindAllStringSubmatch(out, -1)
	if len(rows) != 2 || rows[0][1] != strconv.Itoa(kernels.DefaultThreads()) || rows[1][1] != "1" || !strings.Contains(out, "3 runs (medians") {
		t.Errorf("want rows for %d and 1 threads, medians with their range:\n%s", kernels.DefaultThreads(), out)
	}
}

func TestATokenizerThatDiffersFromTheFilesIsNoted(t *testing.T) {
	gguf := testutil.Model(t, "stories260K.gguf")
	// The GGUF's own vocabulary in llama2.c's spelling: nothing to say.
	code, _, errOut := tandem(t, "generate", "--model", gguf, "--tokenizer", testutil.Model(t, "tok512.bin"), "--max-tokens", "2")
	if code != 0 || strings.Contains(errOut, "differs") {
		t.Errorf("the file's own vocabulary: exit %d, %q", code, errOut)
	}
	// Another vocabulary of the same size: used, and said so.
	code, _, errOut = tandem(t, "generate", "--model", gguf, "--tokenizer", testutil.Model(t, "extra/aidreams_tok512.bin"), "--max-tokens", "2")
	if code != 0 || !strings.Contains(errOut, "differs from the vocabulary in") {
		t.Errorf("another vocabulary: exit %d, %q; want a note", code, errOut)
	}
}

func TestSpeculativeStatsCountOnlyOutput(t *testing.T) {
	// The embedded pair's first pass accepts several tokens; with one
	// allowed, the stats count that one.
	code, out, errOut := tandem(t, "generate", "--max-tokens", "1", "--json")
	if code != 0 {
		t.Fatal(errOut)
	}
	var got struct {
		IDs   []int32 `json:"ids"`
		Stats struct {
			Spec struct {
				Passes   int     `json:"target_passes"`
				PerPass  float64 `json:"tokens_per_target_pass"`
				Accepted int     `json:"draft_tokens_accepted"`
			} `json:"speculative"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	sp := got.Stats.Spec
	if len(got.IDs) != 1 || sp.Passes != 1 || sp.PerPass != 1 {
		t.Errorf("%d ids, %d passes, %.2f tokens per pass (%d drafted accepted); want 1, 1, 1", len(got.IDs), sp.Passes, sp.PerPass, sp.Accepted)
	}
}

func TestInterruptedIs130(t *testing.T) {
	// Verbs cancel their context on Ctrl-C; the exit says so.
	verbs["test-interrupted"] = verb{"", func(_ []string, _, _ io.Writer) error {
		return fmt.Errorf("generate: %w", context.Canceled)
	}}
	defer delete(verbs, "test-interrupted")
	if code, _, errOut := tandem(t, "test-interrupted"); code != 130 || errOut != "tandem test-interrupted: interrupted\n" {
		t.Errorf("exit %d, stderr %q; want 130 and one line", code, errOut)
	}
	// One that saved something says what (train's checkpoint).
	verbs["test-interrupted"] = verb{"", func(_ []string, _, _ io.Writer) error {
		return fmt.Errorf("train: %w", interruptedError("interrupted at step 7; checkpoint c.gguf written"))
	}}
	if code, _, errOut := tandem(t, "test-interrupted"); code != 130 || errOut != "tandem test-interrupted: interrupted at step 7; checkpoint c.gguf written\n" {
		t.Errorf("exit %d, stderr %q; want 130 and what was saved", code, errOut)
	}
}

func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	t.Setenv("TANDEM_CPUPROFILE", path)
	if code, out, errOut := tandem(t, "version"); code != 0 || !strings.HasPrefix(out, "tandem ") {
		t.Fatalf("version with a profile: exit %d, %q %q", code, out, errOut)
	}
	// pprof writes a gzipped protocol buffer.
	if b, err := os.ReadFile(path); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("profile %s: %d bytes, %v; want a gzipped pprof profile", path, len(b), err)
	}
	t.Setenv("TANDEM_CPUPROFILE", filepath.Join(t.TempDir(), "missing", "cpu.prof"))
	if code, _, errOut := tandem(t, "version"); code != 1 || !strings.Contains(errOut, "TANDEM_CPUPROFILE") {
		t.Errorf("unwritable profile: exit %d, %q; want 1 and the variable named", code, errOut)
	}
}

func TestInspectJSON(t *testing.T) {
	code, out, errOut := tandem(t, "inspect", "--json", testutil.Model(t, "stories260K.gguf"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Architecture string         `json:"architecture"`
		TensorCount  int            `json:"tensor_count"`
		Tensors      []tensorJSON   `json:"tensors"`
		Metadata     map[string]any `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Architecture != "llama" || got.TensorCount != 48 || len(got.Tensors) != 48 {
		t.Errorf("architecture %q, %d tensors", got.Architecture, got.TensorCount)
	}
	for k, want := range map[string]float64{"llama.embedding_length": 64, "llama.block_count": 5, "llama.attention.head_count_kv": 4} {
		if got.Metadata[k] != want {
			t.Errorf("%s = %v, want %v", k, got.Metadata[k], want)
		}
	}
	if toks, ok := got.Metadata["tokenizer.ggml.tokens"].(map[string]any); !ok || toks["len"] != float64(512) {
		t.Errorf("token array summary: %v", got.Metadata["tokenizer.ggml.tokens"])
	}
	code, out, _ = tandem(t, "inspect", testutil.Model(t, "stories260K.bin"))
	if code != 0 || !strings.Contains(out, "blk.4.ffn_down.weight") || !strings.Contains(out, "llama2c") {
		t.Errorf("text inspect of a llama2.c file: %d\n%s", code, out)
	}
	// Text shows a long array as its length and element type.
	code, out, _ = tandem(t, "inspect", testutil.Model(t, "stories260K.gguf"))
	if code != 0 || !strings.Contains(out, "[512 × string]") || strings.Contains(out, "map[") {
		t.Errorf("text inspect of the vocabulary:\n%s", out)
	}
}

func TestConvertThenInspectAndGenerate(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "s.gguf")
	bin, tok := testutil.Model(t, "stories260K.bin"), testutil.Model(t, "tok512.bin")
	if code, _, errOut := tandem(t, "convert", bin, out); code != 2 || !strings.Contains(errOut, "--tokenizer") {
		t.Errorf("convert without tokenizer: exit %d, %q", code, errOut)
	}
	// An output it cannot write is named, not its temporary file.
	missing := filepath.Join(dir, "missing", "s.gguf")
	if code, _, errOut := tandem(t, "convert", bin, "--tokenizer", tok, missing); code != 2 || !strings.Contains(errOut, missing+": its directory") || strings.Contains(errOut, ".tmp") {
		t.Errorf("convert into a missing directory: exit %d, %q", code, errOut)
	}
	if code, _, errOut := tandem(t, "convert", bin, "--tokenizer", tok, out); code != 0 {
		t.Fatalf("convert: %s", errOut)
	}
	// A type the rows do not fit: the summary says how many matrices
	// fell back (it named the file Q4_0 alone).
	code, stdout, errOut := tandem(t, "convert", "--type", "q4_0", testutil.Model(t, "llama-2-tiny-random.gguf"), filepath.Join(dir, "q.gguf"))
	if code != 0 || !strings.Contains(stdout, "(Q4_0, ") || !regexp.MustCompile(`Q4_0, \d+ matrices as F16, 12 tensors`).MatchString(stdout) {
		t.Errorf("convert --type q4_0 with rows of 8: exit %d, %q (%s); want the matrices written as F16 counted", code, stdout, errOut)
	}
	ref, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	conv, err := weights.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer conv.Close()
	for _, ct := range conv.Tensors {
		rt, ok := ref.Tensor(ct.Name)
		if !ok || !bytes.Equal(ct.Data, rt.Data) {
			t.Errorf("%s differs from stories260K.gguf", ct.Name)
		}
	}
	// The converted file carries its vocabulary: generate needs no --tokenizer,
	// and greedy decoding gives the reference story.
	code, js, errOut := tandem(t, "generate", "--model", out, "--prompt", "Once upon a time", "--max-tokens", "12", "--json")
	if code != 0 {
		t.Fatalf("generate: %s", errOut)
	}
	var res struct {
		PromptIDs []int32        `json:"prompt_ids"`
		IDs       []int32        `json:"ids"`
		Text      string         `json:"text"`
		Stats     map[string]any `json:"stats"`
	}
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.IDs) != 12 || !strings.HasPrefix(res.Text, ", there was a little girl named Lily") {
		t.Errorf("generated %d ids: %q", len(res.IDs), res.Text)
	}
	if res.PromptIDs[0] != 1 || res.Stats["generated_tokens"] != float64(12) {
		t.Errorf("prompt ids %v, stats %v", res.PromptIDs, res.Stats)
	}
	for _, q := range []string{"q8_0", "q4_0", "f16"} {
		qo := filepath.Join(dir, q+".gguf")
		code, _, errOut := tandem(t, "convert", "--type", q, out, qo)
		if code != 0 || (q != "f16") != strings.Contains(errOut, "ffn_down") {
			t.Errorf("convert to %s: exit %d, %q (block types note the ffn_down fallback)", q, code, errOut)
		}
		code, js, errOut = tandem(t, "generate", "--model", qo, "--max-tokens", "4", "--json")
		if code != 0 || !strings.Contains(js, `"generated_tokens":4`) {
			t.Errorf("generate with %s: %d %s", q, code, errOut)
		}
	}
}

func TestGenerateStreamsAndStops(t *testing.T) {
	bin, tok := testutil.Model(t, "stories260K.bin"), testutil.Model(t, "tok512.bin")
	code, _, errOut := tandem(t, "generate", "--model", bin, "--prompt", "Once upon a time", "--max-tokens", "0")
	if code != 2 || !strings.Contains(errOut, "--tokenizer") {
		t.Errorf("llama2.c model without tokenizer: exit %d, %q", code, errOut)
	}
	code, out, errOut := tandem(t, "generate", "--model", bin, "--tokenizer", tok, "--prompt", "Once upon a time", "--max-tokens", "0")
	if code != 0 {
		t.Fatal(errOut)
	}
	// With no limit the story runs until the model emits BOS.
	if !strings.HasPrefix(out, "Once upon a time, there was a little girl named Lily.") || !strings.Contains(errOut, "stop token") {
		t.Errorf("output %q, stats %q", out, errOut)
	}
	// --json's text is what the stream printed after the prompt, its
	// first piece's leading space kept (decoding the ids alone drops it).
	prompt := "Lily and Tom went to the park."
	_, streamed, _ := tandem(t, "generate", "--model", bin, "--tokenizer", tok, "--prompt", prompt, "--max-tokens", "5")
	_, out, _ = tandem(t, "generate", "--model", bin, "--tokenizer", tok, "--prompt", prompt, "--max-tokens", "5", "--json")
	var res struct{ Text string }
	if err := json.Unmarshal([]byte(out), &res); err != nil || prompt+res.Text+"\n" != streamed || !strings.HasPrefix(res.Text, " ") {
		t.Errorf("--json text %q (%v), streamed %q", res.Text, err, streamed)
	}
	// A tokenizer of another model is refused before any work, as bad
	// usage, by every verb that runs the model (serve:
	// TestServeRefusesAWrongTokenizer).
	for _, verb := range [][]string{{"generate"}, {"calibrate", "--out", filepath.Join(t.TempDir(), "c.json")}} {
		code, _, errOut = tandem(t, append(verb, "--model", bin, "--tokenizer", testutil.Model(t, "tokenizer.bin"))...)
		if code != 2 || !strings.Contains(errOut, "32000") || !strings.Contains(errOut, "--tokenizer") {
			t.Errorf("%s with a mismatched tokenizer: exit %d, %q", verb[0], code, errOut)
		}
	}
}

func TestTokenize(t *testing.T) {
	for _, args := range [][]string{
		{"--tokenizer", testutil.Model(t, "tok512.bin")},
		{"--model", testutil.Model(t, "stories260K.gguf")},
	} {
		code, out, errOut := tandem(t, append([]string{"tokenize", "--json", "--bos"}, append(args, "Once upon a time")...)...)
		if code != 0 {
			t.Fatal(errOut)
		}
		var got struct {
			IDs    []int32  `json:"ids"`
			Pieces []string `json:"pieces"`
		}
		json.Unmarshal([]byte(out), &got)
		// prompt_ids of the first stories260K reference record.
		if !equalIDs(got.IDs, []int32{1, 403, 407, 261, 378}) || got.Pieces[1] != "▁Once" {
			t.Errorf("%v: ids %v pieces %q", args, got.IDs, got.Pieces)
		}
	}
	code, out, _ := tandem(t, "tokenize", "--model", testutil.Model(t, "ggml-vocab-llama-spm.gguf"), "Hello world")
	if code != 0 || strings.TrimSpace(out) != "15043 3186" {
		t.Errorf("llama vocab: %q", out)
	}
	// Without --model or --tokenizer: the embedded model's vocabulary.
	f, err := defaultmodel.Target()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.ForModel(f, "")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tok.Encode("Once upon a time", tokenizer.EncodeOptions{})
	if err != nil || len(want) == 0 {
		t.Fatalf("the embedded vocabulary: %v, %v", want, err)
	}
	code, out, errOut := tandem(t, "tokenize", "Once upon a time")
	if code != 0 || strings.TrimSpace(out) != strings.Trim(fmt.Sprint(want), "[]") {
		t.Errorf("tokenize with the embedded vocabulary: exit %d, %q (%s), want %v", code, out, errOut, want)
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSynthThenGenerate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.gguf")
	code, _, errOut := tandem(t, "synth", "--dims", "64,128,2,4,2,300", "--type", "q4_0", p)
	if code != 0 {
		t.Fatal(errOut)
	}
	code, out, _ := tandem(t, "inspect", "--json", p)
	if code != 0 || !strings.Contains(out, `"Q4_0"`) {
		t.Errorf("inspect of a synthetic model: %d", code)
	}
	code, out, errOut = tandem(t, "generate", "--model", p, "--prompt", "héllo", "--max-tokens", "5", "--json")
	if code != 0 || !strings.Contains(out, `"generated_tokens":5`) {
		t.Errorf("generate on a synthetic model: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := tandem(t, "synth", "--shape", "stories15m", "--vocab", testutil.Model(t, "tok512.bin"), filepath.Join(dir, "x.gguf")); code != 1 || !strings.Contains(errOut, "32000") {
		t.Errorf("vocab mismatch: %d %q", code, errOut)
	}
}

// TestDefaultModelRuns runs the README's first command: the embedded
// target speculates with the embedded draft, writes a story in the
// corpus's words, and gives the same text as the target alone.
func TestDefaultModelRuns(t *testing.T) {
	var runs [2]struct {
		Text  string `json:"text"`
		Stats struct {
			Spec *specStats `json:"speculative"`
		} `json:"stats"`
	}
	for i, mode := range []string{"tree", "target"} {
		code, out, errOut := tandem(t, "generate", "--max-tokens", "60", "--json", "--mode", mode)
		if code != 0 || json.Unmarshal([]byte(out), &runs[i]) != nil {
			t.Fatalf("default model, --mode %s: exit %d: %s %s", mode, code, out, errOut)
		}
	}
	tree, alone := runs[0], runs[1]
	if tree.Stats.Spec == nil || tree.Stats.Spec.TargetPasses == 0 || alone.Stats.Spec != nil {
		t.Fatalf("speculative stats: tree %+v, target alone %+v", tree.Stats.Spec, alone.Stats.Spec)
	}
	if tree.Text != alone.Text {
		t.Errorf("tree wrote %q, the target alone %q", tree.Text, alone.Text)
	}
	known := map[string]bool{}
	for i := range 2000 {
		for _, w := range strings.FieldsFunc(corpus.Story(1, i), notLetter) {
			known[w] = true
		}
	}
	words := strings.FieldsFunc(tree.Text, notLetter)
	if len(words) < 20 {
		t.Errorf("the default target wrote %q", tree.Text)
	}
	for _, w := range words {
		if !known[w] {
			t.Errorf("the default target wrote %q, not a word of the story corpus, in %q", w, tree.Text)
		}
	}
}

func notLetter(r rune) bool { return !unicode.IsLetter(r) }

func TestInfo(t *testing.T) {
	orin := filepath.Join("..", "..", "jetson", "testdata", "orin-agx-jp5")
	code, out, errOut := tandem(t, "info", "--root", orin)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"NVIDIA Jetson (Orin, tegra234, chip 0x23, CUDA 8.7)", "R35.4.1 (JetPack 5.1.2)",
		"MAXN (id 0, from /var/lib/nvpmodel/status)", "ga10b at /sys/devices/platform/17000000.ga10b: load 12.1%",
		"12 online (0-11)", "throttling:  no", "thermal_zone10", "CV0-therm     offline",
		"  clusters:  0-11 (capacity unknown), alike: pin lanes with CPU lists (--lanes 6@0-5,6@6-11)"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = tandem(t, "info", "--json", "--root", filepath.Join("..", "..", "jetson", "testdata", "xavier-nx-jp5"))
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	var got struct {
		Jetson bool `json:"jetson"`
		Board  struct {
			Family  string `json:"family"`
			JetPack string `json:"jetpack"`
		} `json:"board"`
		Power struct {
			Name string `json:"name"`
		} `json:"power_mode"`
		Thermal struct {
			Throttling *bool `json:"throttling"`
		} `json:"thermal"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if !got.Jetson || got.Board.Family != "Xavier" || got.Board.JetPack != "5.1.3" || got.Power.Name != "MODE_10W_4CORE" ||
		got.Thermal.Throttling == nil || !*got.Thermal.Throttling {
		t.Errorf("--json: %+v", got)
	}
	// A phone's cores, by the kernel's capacities: --lanes big and little.
	files := map[string]string{"sys/devices/system/cpu/online": "0-7"}
	for c, capacity := range []string{"325", "325", "325", "325", "870", "870", "870", "1024"} {
		files[fmt.Sprintf("sys/devices/system/cpu/cpu%d/cpu_capacity", c)] = capacity
	}
	phone := testutil.WriteTree(t, files)
	code, out, errOut = tandem(t, "info", "--root", phone)
	if want := "  clusters:  7 (capacity 1024), 4-6 (capacity 870), 0-3 (capacity 325): --lanes N@big pins a lane to 4-7, N@little to 0-3"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("a phone's cores: exit %d, output lacks %q:\n%s%s", code, want, out, errOut)
	}
	// --json gives the clusters as CPU lists.
	code, out, errOut = tandem(t, "info", "--json", "--root", phone)
	if want := `"clusters":[{"cpus":"7","capacity":1024},{"cpus":"4-6","capacity":870},{"cpus":"0-3","capacity":325}]`; code != 0 || !strings.Contains(strings.Join(strings.Fields(out), ""), want) {
		t.Errorf("a phone's cores, --json: exit %d, output lacks %s:\n%s%s", code, want, out, errOut)
	}
	// This machine: whatever it is, the probe must succeed.
	if code, out, errOut := tandem(t, "info"); code != 0 || !strings.Contains(out, "platform:") {
		t.Errorf("info on this machine: exit %d, %s%s", code, out, errOut)
	}
	if code, _, _ := tandem(t, "info", "extra"); code != 2 {
		t.Errorf("extra argument: exit %d, want 2", code)
	}
	if code, _, errOut := tandem(t, "info", "--root", filepath.Join(t.TempDir(), "absent")); code != 1 || !strings.Contains(errOut, "probe root") {
		t.Errorf("missing root: exit %d, %q", code, errOut)
	}
}

// TestInspectEscapesTheFilesStrings: a file's keys, strings and tensor
// names reach the terminal quoted when they hold control characters; a
// name that cleared the screen and forged a "tensors: 0" line was
// printed raw.
func TestInspectEscapesTheFilesStrings(t *testing.T) {
	var md weights.Metadata
	md.Set("general.architecture", weights.StringValue("llama"))
	md.Set("general.name", weights.StringValue("\x1b[2J\x1b[Htensors: 0\r"))
	md.Set("x.\x07bell", weights.Uint32Value(1))
	path := filepath.Join(t.TempDir(), "esc.gguf")
	tensors := []weights.TensorInfo{{Name: "w\x1b[2K\rforged", Type: weights.F32, Shape: []uint64{2}}}
	if err := weights.WriteGGUF(path, &md, tensors, func(_ int, w io.Writer) error { _, err := w.Write(make([]byte, 8)); return err }); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := tandem(t, "inspect", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.ContainsAny(out, "\x1b\x07\r") {
		t.Errorf("control characters printed raw:\n%q", out)
	}
	for _, want := range []string{`"\x1b[2J\x1b[Htensors: 0\r"`, `"x.\abell"`, `"w\x1b[2K\rforged"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
}
