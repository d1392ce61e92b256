package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/train"
	"github.com/tandem-llm/tandem/weights"
)

// TestCorpusTrainGenerateEval runs the recipe of the default pair at toy
// scale through the CLI: corpus and vocabulary, a trained model that
// generate runs with its embedded vocabulary, an interrupted-looking run
// resumed from its checkpoint, and eval.
func TestCorpusTrainGenerateEval(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "s.txt")
	code, out, errOut := tandem(t, "corpus", "--stories", "300", "--seed", "5", "--vocab", "400", text)
	if code != 0 || !strings.Contains(out, "300 stories") || !strings.Contains(out, "400 tokens") {
		t.Fatalf("corpus: %d %s %s", code, out, errOut)
	}
	vocab := filepath.Join(dir, "s.vocab.gguf")
	model := filepath.Join(dir, "m.gguf")
	args := []string{"train", "--data", text, "--vocab", vocab, "--shape", "32,64,1,4,2,64", "--steps", "6", "--batch", "2",
		"--threads", "2", "--out", model, "--type", "q8_0", "--ckpt-every", "3"}
	code, out, errOut = tandem(t, args...)
	if code != 0 || !strings.Contains(out, "wrote "+model) || !strings.Contains(errOut, "step 6/6") {
		t.Fatalf("train: %d %s %s", code, out, errOut)
	}
	f, err := weights.Open(model)
	if err != nil {
		t.Fatal(err)
	}
	if ft, _ := f.Metadata.Uint("general.file_type"); ft != uint64(weights.FileTypeQ8_0) {
		t.Errorf("file type %d, want q8_0", ft)
	}
	f.Close()
	// The checkpoint is complete: --resume finds nothing left to do and
	// writes the same model.
	before, _ := os.ReadFile(model)
	code, _, errOut = tandem(t, append(args, "--resume")...)
	after, _ := os.ReadFile(model)
	if code != 0 || !strings.Contains(errOut, "from step 6 of 6") || string(before) != string(after) {
		t.Errorf("resume of a finished run: %d %s (model unchanged: %v)", code, errOut, string(before) == string(after))
	}
	code, js, errOut := tandem(t, "generate", "--model", model, "--max-tokens", "5", "--json")
	if code != 0 || !strings.Contains(js, `"generated_tokens"`) {
		t.Errorf("generate with the trained model: %d %s %s", code, js, errOut)
	}
	held := filepath.Join(dir, "h.txt")
	tandem(t, "corpus", "--stories", "20", "--first", "1000000", held)
	code, js, errOut = tandem(t, "eval", "--model", model, "--draft", model, "--data", held, "--prompts", "defaultmodel/prompts.txt",
		"--gen", "8", "--ctx", "64", "--windows", "4", "--json")
	var rep struct {
		HeldOut []struct {
			Loss float64 `json:"loss_nats_per_token"`
		} `json:"held_out"`
		Agreement struct {
			Rate float64 `json:"rate"`
		} `json:"agreement"`
	}
	if code != 0 || json.Unmarshal([]byte(js), &rep) != nil || len(rep.HeldOut) != 2 || rep.Agreement.Rate != 1 {
		t.Errorf("eval of a model against itself: %d %s %s", code, js, errOut)
	}
}

func TestTrainBadInput(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "s.txt")
	if code, _, errOut := tandem(t, "corpus", "--stories", "3", "--vocab", "2000", text); code != 1 || !strings.Contains(errOut, "smaller vocabulary") {
		t.Errorf("vocabulary too big for the corpus: %d %s", code, errOut)
	}
	tandem(t, "corpus", "--stories", "200", "--vocab", "300", text)
	vocab := filepath.Join(dir, "s.vocab.gguf")
	out := filepath.Join(dir, "m.gguf")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--shape", "30,64,1,4,2"}, 2, "does not divide into 4 heads"},
		{[]string{"--shape", "32,64,1,4,3"}, 2, "do not divide 4 heads"},
		{[]string{"--shape", "32,64,1,4,2,9000"}, 1, "fewer than one window"},
		{[]string{"--shape", "32,64,1,4,2", "--type", "q4_k"}, 2, "--type"},
		{[]string{"--shape", "32,64,1,4,2", "--steps", "0"}, 2, "--tokens or --steps"},
	} {
		args := append([]string{"train", "--data", text, "--vocab", vocab, "--out", out, "--steps", "1"}, tc.args...)
		if code, _, errOut := tandem(t, args...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %s; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	code, _, errOut := tandem(t, "train", "--data", text, "--vocab", vocab, "--out", out, "--shape", "32,64,1,4,2,32", "--steps", "2",
		"--resume", "--ckpt", filepath.Join(dir, "c.gguf"), "--lr", "1e-3")
	if code != 0 {
		t.Fatal(errOut)
	}
	code, _, errOut = tandem(t, "train", "--data", text, "--vocab", vocab, "--out", out, "--shape", "32,64,1,4,2,32", "--steps", "2",
		"--resume", "--ckpt", filepath.Join(dir, "c.gguf"), "--lr", "3e-3")
	if code != 1 || !strings.Contains(errOut, "learning rate") {
		t.Errorf("resume with another learning rate: %d %s", code, errOut)
	}
}

// TestDistillStories260K distills a toy draft from a real target through
// the CLI, from its GGUF and from its llama2.c file with --tokenizer.
func TestDistillStories260K(t *testing.T) {
	gguf, bin, tok := testutil.Model(t, "stories260K.gguf"), testutil.Model(t, "stories260K.bin"), testutil.Model(t, "tok512.bin")
	dir := t.TempDir()
	out := filepath.Join(dir, "drafts", "d.gguf") // a folder distill creates
	common := []string{"--shape", "32,64,1,2,1,64", "--tokens", "2000", "--batch", "4", "--gen", "8", "--out", out, "--kl"}
	code, so, errOut := tandem(t, append([]string{"distill", "--target", gguf}, common...)...)
	if code != 0 || !strings.Contains(so, "agreement:") || !strings.Contains(errOut, "sampled") {
		t.Fatalf("distill: %d %s %s", code, so, errOut)
	}
	f, err := weights.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	c, err := train.ConfigFromFile(f)
	if err != nil || c.Vocab != 512 || c.Dim != 32 {
		t.Errorf("draft config %+v: %v", c, err)
	}
	if toks, _ := f.Metadata.Strings("tokenizer.ggml.tokens"); len(toks) != 512 {
		t.Errorf("the draft carries %d tokens of the target's vocabulary", len(toks))
	}
	f.Close()
	if code, _, errOut := tandem(t, append([]string{"distill", "--target", bin}, common...)...); code != 2 || !strings.Contains(errOut, "--tokenizer") {
		t.Errorf("llama2.c target without a tokenizer: %d %s", code, errOut)
	}
	if code, _, errOut := tandem(t, append([]string{"distill", "--target", bin, "--tokenizer", tok, "--prompts", "defaultmodel/prompts.txt"}, common...)...); code != 0 {
		t.Errorf("llama2.c target with --tokenizer: %d %s", code, errOut)
	}
	if code, _, errOut := tandem(t, "distill", "--target", gguf, "--shape", "30,64,1,4,1", "--tokens", "100", "--out", out); code != 2 || !strings.Contains(errOut, "heads") {
		t.Errorf("bad draft shape: %d %s", code, errOut)
	}
}
