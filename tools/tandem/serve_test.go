//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// startServe runs the serve verb with args on a free port until it says
// it is ready, and returns its address, its stderr lines so far, and a
// channel that receives its exit code.
func startServe(t *testing.T, args ...string) (string, []string, chan int, func() string) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(append([]string{"serve", "--addr", "127.0.0.1:0", "--drain-timeout", "2s"}, args...), io.Discard, pw)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	addr := ""
	var log []string
	for sc.Scan() {
		line := sc.Text()
		log = append(log, line)
		if m := regexp.MustCompile(`listening on (http://\S+),`).FindStringSubmatch(line); m != nil {
			addr = m[1]
		}
		if strings.Contains(line, "ready:") {
			break
		}
	}
	var rest strings.Builder
	copied := make(chan struct{})
	go func() {
		io.Copy(&rest, pr)
		close(copied)
	}()
	if addr == "" || !strings.Contains(log[len(log)-1], "ready:") {
		t.Fatalf("serve did not start: %v", log)
	}
	// after returns what serve wrote after "ready", once it has exited.
	after := func() string {
		<-copied
		return rest.String()
	}
	return addr, log, done, after
}

// getMetrics returns the server's /metrics page.
func getMetrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get(addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: status %d, %v", resp.StatusCode, err)
	}
	return string(body)
}

// stopServe stops a server started by startServe with SIGTERM, as a
// service manager would, and checks that it exits cleanly.
func stopServe(t *testing.T, addr string, done chan int) {
	t.Helper()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, done)
	if _, err := http.Get(addr + "/healthz"); err == nil {
		t.Error("still answering after shutdown")
	}
}

// TestServeEmbeddedCalibration: with no --model, serve schedules the
// embedded model with the calibration it ships with: the ready line says
// so, and an open, multi-part request is predicted far longer than its
// prompt (the uncalibrated score is the prompt's length, 37 tokens here).
func TestServeEmbeddedCalibration(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no calibration of the user's
	addr, log, done, _ := startServe(t)
	if ready := log[len(log)-1]; !strings.Contains(ready, "estimator the embedded default calibration") {
		t.Errorf("ready line %q", ready)
	}
	resp, err := http.Post(addr+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"Tell me everything about the little dog and the big tree, and then describe what might happen next, and why?","max_tokens":200,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
		Tandem struct{ Uncertainty float64 }
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion: status %d, %v", resp.StatusCode, err)
	}
	if out.Tandem.Uncertainty < float64(out.Usage.PromptTokens)+50 {
		t.Errorf("predicted %.1f tokens for a %d-token open, multi-part request", out.Tandem.Uncertainty, out.Usage.PromptTokens)
	}
	stopServe(t, addr, done)
}

// TestServeEndToEnd runs the serve verb on a free port, talks to it, then
// stops it.
func TestServeEndToEnd(t *testing.T) {
	addr, log, done, _ := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--lanes", "1,1", "--ctx", "256")
	if !strings.Contains(log[len(log)-1], "2 lane(s)") {
		t.Errorf("ready line %q", log[len(log)-1])
	}
	resp, err := http.Post(addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":8`) {
		t.Errorf("completion: %d %s", resp.StatusCode, body)
	}
	resp, err = http.Get(addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"id":"stories260K"`) {
		t.Errorf("models: %s", body)
	}
	stopServe(t, addr, done)
}

// TestServePrefixReuse: by default a prompt sent again starts from the
// first answer's KV rows; --prefix-reuse=false prefills it whole.
func TestServePrefixReuse(t *testing.T) {
	for _, on := range []bool{true, false} {
		addr, log, done, _ := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--ctx", "256", fmt.Sprintf("--prefix-reuse=%v", on))
		ready := log[len(log)-1]
		if off, cache := strings.Contains(ready, "no prefix reuse"), strings.Contains(ready, "prefix cache 512.0 MiB a lane"); off == on || cache != on {
			t.Errorf("--prefix-reuse=%v: ready line %q", on, ready)
		}
		for range 2 {
			resp, err := http.Post(addr+"/v1/completions", "application/json",
				strings.NewReader(`{"prompt":"Once upon a time there was a cat","max_tokens":8,"temperature":0}`))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		m := regexp.MustCompile(`(?m)^tandem_prefix_reused_tokens_total (\d+)$`).FindStringSubmatch(getMetrics(t, addr))
		if m == nil || (m[1] != "0") != on {
			t.Errorf("--prefix-reuse=%v: reused tokens %q", on, m)
		}
		stopServe(t, addr, done)
	}
}

// TestServeAnswersWhileDraining: after SIGTERM the server drains its
// requests and, meanwhile, still answers /healthz (503, shutting down)
// and /metrics, as a service manager and a dashboard expect.
func TestServeAnswersWhileDraining(t *testing.T) {
	addr, _, done, _ := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--max-batch", "1", "--drain-timeout", "3s")
	const n = 64
	codes := make(chan int, n)
	for range n {
		go postStatus(addr, `{"prompt":"Once upon a time","max_tokens":2000,"temperature":0}`, codes)
	}
	metrics := func() string {
		resp, err := http.Get(addr + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(metrics(), fmt.Sprintf("tandem_requests_admitted_total %d", n)) {
		if time.Now().After(deadline) {
			t.Fatalf("requests not admitted:\n%s", metrics())
		}
		time.Sleep(time.Millisecond)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The drain takes a second or more (64 stories, one at a time); the
	// first poll that sees it must get a 503.
	if health := drainingHealth(t, addr); !strings.Contains(health, "shutting") {
		t.Errorf("/healthz during the drain: %q, want a 503 saying the server shuts down", health)
	}
	if m := metrics(); !strings.Contains(m, "tandem_up 0") {
		t.Errorf("/metrics during the drain lacks tandem_up 0:\n%.300s", m)
	}
	for range n {
		if c := <-codes; c != 200 && c != 503 {
			t.Errorf("a request in flight at SIGTERM ended with %d, want 200 (drained) or 503 (cancelled at the timeout)", c)
		}
	}
	waitExit(t, done)
}

// postStatus posts a completion request, reads the answer to its end,
// and sends its status code (0 if the request failed) to codes.
func postStatus(addr, body string, codes chan<- int) {
	resp, err := http.Post(addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		codes <- 0
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	codes <- resp.StatusCode
}

// drainingHealth polls /healthz for up to 3 s until it answers 503, as
// it does once a drain has begun, and returns that answer ("" if none).
func drainingHealth(t *testing.T, addr string) string {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(addr + "/healthz")
		if err != nil {
			t.Fatalf("/healthz during the drain: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			return string(b)
		}
	}
	return ""
}

// TestServeSecondSignalEndsTheDrain: a second SIGTERM during a drain
// cancels what is left at once, and serve says it stopped the drain (it
// used to say the drain timed out). The request reads its weights at an
// emulated 1 MB/s, about a second a token, so it is still generating
// when the drain begins and when it is stopped.
func TestServeSecondSignalEndsTheDrain(t *testing.T) {
	addr, _, done, after := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--budget", "min", "--io-bandwidth", "1MB/s", "--drain-timeout", "5m")
	code := make(chan int, 1)
	go postStatus(addr, `{"prompt":"Once upon a time","max_tokens":200,"temperature":0}`, code)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(getMetrics(t, addr), "tandem_requests_admitted_total 1"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request was not admitted")
		}
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if health := drainingHealth(t, addr); health == "" {
		t.Fatal("no drain began")
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, done)
	if c := <-code; c == http.StatusOK {
		t.Error("the request finished: it should have been cancelled with the drain")
	}
	if log := after(); !strings.Contains(log, "stopped before the drain ended; the remaining requests were cancelled") || strings.Contains(log, "timed out") {
		t.Errorf("serve's log after the second signal:\n%s\nwant it to say it stopped the drain", log)
	}
}

// waitExit waits for a stopping server's exit code, which must be 0.
func waitExit(t *testing.T, done chan int) {
	t.Helper()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

// TestServeRefusesAWrongTokenizer: serve checks the tokenizer against the
// model before it listens (it used to serve, failing every request), as
// bad usage.
func TestServeRefusesAWrongTokenizer(t *testing.T) {
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"serve", "--addr", "127.0.0.1:0", "--model", testutil.Model(t, "stories260K.bin"),
			"--tokenizer", testutil.Model(t, "tokenizer.bin")}, io.Discard, &errOut)
	}()
	select {
	case code := <-done:
		if code != 2 || !strings.Contains(errOut.String(), "32000") || !strings.Contains(errOut.String(), "--tokenizer") || strings.Contains(errOut.String(), "listening") {
			t.Errorf("exit %d, %q", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
		<-done
		t.Fatal("serve started with a tokenizer of another model")
	}
}

// greedyAnswers returns the prompts of the first k stories260K reference
// records and the text of their first n greedy tokens (decoded after the
// prompt, as the server decodes them), for completions with
// temperature 0 and max_tokens n.
func greedyAnswers(t *testing.T, k, n int) (prompts, want []string) {
	t.Helper()
	tok, err := tokenizer.Load(testutil.Model(t, "tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range testutil.GreedyRecords(t, "stories260K.greedy.jsonl")[:k] {
		dec := tok.NewDecoder()
		for _, id := range r.PromptIDs {
			dec.Next(id)
		}
		var b strings.Builder
		for _, id := range r.GeneratedIDs[:n] {
			if id == tok.BOS() || id == tok.EOS() {
				t.Fatalf("record %d ends within %d tokens; pick a longer one", i, n)
			}
			b.WriteString(dec.Next(id))
		}
		prompts = append(prompts, r.Prompt)
		want = append(want, b.String()+dec.Flush())
	}
	return prompts, want
}

// checkCompletion asks addr for a greedy completion of prompt, n tokens
// long, and checks that it returns want (what names the request in
// errors).
// checkCompletions sends copies of every prompt at once and checks each
// answer against want (checkCompletion).
func checkCompletions(t *testing.T, addr string, prompts, want []string, n, copies int) {
	t.Helper()
	var wg sync.WaitGroup
	for c := range copies {
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				checkCompletion(t, addr, p, n, want[i], fmt.Sprintf("record %d, copy %d", i, c))
			}()
		}
	}
	wg.Wait()
}

func checkCompletion(t *testing.T, addr, prompt string, n int, want, what string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0}`, prompt, n)
	resp, err := http.Post(addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	var got struct {
		Choices []struct{ Text string }
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 || len(got.Choices) != 1 {
		t.Errorf("%s: status %d, %v, %+v", what, resp.StatusCode, err, got)
		return
	}
	if got.Choices[0].Text != want || got.Usage.CompletionTokens != n {
		t.Errorf("%s: %d tokens %q\nwant %d tokens %q", what, got.Usage.CompletionTokens, got.Choices[0].Text, n, want)
	}
}

// TestServeDraft serves stories260K with llama2xs as its draft and gets
// the target's greedy text (the shared reference vectors, decoded) back
// through /v1/completions, for each lossless mode, several requests at
// once.
func TestServeDraft(t *testing.T) {
	n := 48
	if testing.Short() {
		n = 16
	}
	prompts, want := greedyAnswers(t, 3, n)
	for _, mode := range []string{"tree", "sd"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"--model", testutil.Model(t, "stories260K.bin"), "--tokenizer", testutil.Model(t, "tok512.bin"),
				"--draft", testutil.Model(t, "llama2xs_model.bin"), "--mode", mode, "--lanes", "1"}
			if mode == "sd" {
				// A draft window shorter than the answers: it slides.
				args = append(args, "--draft-ctx", "24")
			}
			addr, log, done, after := startServe(t, args...)
			if ready := log[len(log)-1]; !strings.Contains(ready, "speculative ("+mode) {
				t.Errorf("ready line %q does not say it speculates", ready)
			}
			var wg sync.WaitGroup
			for i, prompt := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					checkCompletion(t, addr, prompt, n, want[i], fmt.Sprintf("record %d", i))
				}()
			}
			wg.Wait()
			// The lane's speculative counters: a pass verifies at most
			// one round per sequence here (one lane, requests at once
			// share passes), the target accepted some drafted tokens and
			// no more than it checked, and only the tree's cost trigger
			// can pause drafting.
			var passes, rounds, drafted, accepted, undrafted, slides float64
			for _, line := range strings.Split(getMetrics(t, addr), "\n") {
				fmt.Sscanf(line, `tandem_lane_spec_passes_total{lane="spec0"} %g`, &passes)
				fmt.Sscanf(line, `tandem_lane_spec_rounds_total{lane="spec0"} %g`, &rounds)
				fmt.Sscanf(line, `tandem_lane_spec_drafted_tokens_total{lane="spec0"} %g`, &drafted)
				fmt.Sscanf(line, `tandem_lane_spec_accepted_tokens_total{lane="spec0"} %g`, &accepted)
				fmt.Sscanf(line, `tandem_lane_spec_undrafted_rounds_total{lane="spec0"} %g`, &undrafted)
				fmt.Sscanf(line, `tandem_lane_spec_draft_window_slides_total{lane="spec0"} %g`, &slides)
			}
			if (mode == "sd") != (slides > 0) {
				t.Errorf("/metrics: the draft's window slid %g times; want it to slide only under --draft-ctx", slides)
			}
			if passes <= 0 || rounds < passes || accepted <= 0 || accepted > drafted || undrafted > rounds || (mode == "sd" && undrafted > 0) {
				t.Errorf("/metrics: %g passes, %g rounds, %g drafted tokens, %g accepted, %g undrafted rounds", passes, rounds, drafted, accepted, undrafted)
			}
			stopServe(t, addr, done)
			// The draft's savings, then the last word.
			out := after()
			stats, stopped := strings.Index(out, " per pass), acceptance"), strings.Index(out, "tandem serve: stopped")
			if stats < 0 || stopped < stats || !strings.HasSuffix(out, "tandem serve: stopped\n") {
				t.Errorf("after serving: %q; want the lanes' speculative stats, then stopped, last", out)
			}
		})
	}
}

// TestServeDraftRefused: bad speculative settings fail before serving,
// saying what is wrong.
func TestServeDraftRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"mode without draft", []string{"--mode", "sd"}, 2, "needs a draft model"},
		{"unknown mode", []string{"--draft", "x.bin", "--mode", "std"}, 2, "want tree, sd or bild"},
		{"bad tuning", []string{"--draft", "x.bin", "--max-tree", "0"}, 2, "--max-tree"},
		{"draft window of one", []string{"--draft", "x.bin", "--draft-ctx", "1"}, 2, "--draft-ctx 1"},
		{"missing draft", []string{"--model", testutil.Model(t, "stories260K.gguf"), "--draft", "/nonexistent/draft.bin"}, 1, "--draft"},
		{"other vocabulary", []string{"--model", testutil.Model(t, "stories260K.gguf"), "--draft", testutil.Model(t, "llama-2-tiny-random.gguf")}, 1, "tokenizer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := tandem(t, append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d (want %d): %s", code, tc.code, stderr)
			}
		})
	}
}

// TestServeBudget: `tandem serve --budget min` streams each lane's
// weights from the file through the smallest window the model allows,
// and concurrent completions on two streamed lanes still give the
// reference greedy text, also with a draft drafting while the weights
// stream from emulated flash (--io-bandwidth). A budget below that minimum fails at startup and says what the
// model needs.
func TestServeBudget(t *testing.T) {
	const n = 24
	prompts, want := greedyAnswers(t, 3, n)
	gguf := testutil.Model(t, "stories260K.gguf")
	addr, log, done, _ := startServe(t, "--model", gguf, "--lanes", "1,1", "--ctx", "256", "--budget", "min")
	if ready := log[len(log)-1]; !strings.Contains(ready, "weights streamed") || !strings.Contains(ready, "per lane (min)") {
		t.Errorf("ready line %q does not say the weights stream", ready)
	}
	checkCompletions(t, addr, prompts, want, n, 2)
	// Each lane that served read its weights from the file and held
	// some; the metrics say so.
	metrics := getMetrics(t, addr)
	served := 0
	for _, l := range []string{"cpu0", "cpu1"} {
		var tokens, read, peak float64
		for _, line := range strings.Split(metrics, "\n") {
			fmt.Sscanf(line, `tandem_lane_tokens_generated_total{lane="`+l+`"} %g`, &tokens)
			fmt.Sscanf(line, `tandem_lane_weights_read_bytes_total{lane="`+l+`"} %g`, &read)
			fmt.Sscanf(line, `tandem_lane_weights_peak_bytes{lane="`+l+`"} %g`, &peak)
		}
		if tokens == 0 {
			continue
		}
		served++
		if read <= 0 || peak <= 0 {
			t.Errorf("lane %s generated %g tokens with %g weight bytes read, at most %g held; want both above 0", l, tokens, read, peak)
		}
	}
	if served == 0 {
		t.Error("no lane generated tokens, by the metrics")
	}
	stopServe(t, addr, done)

	// With a draft, a streamed lane drafts while it waits for weights,
	// and the answers are still the model's own.
	// Reads emulated at 1 GB/s, as from a phone's flash.
	addr, log, done, _ = startServe(t, "--model", gguf, "--ctx", "256", "--budget", "min", "--io-bandwidth", "1GB/s",
		"--draft", testutil.Model(t, "llama2xs_model.bin"), "--draft-tokenizer", testutil.Model(t, "tok512.bin"))
	if ready := log[len(log)-1]; !strings.Contains(ready, "drafting while weights stream") || !strings.Contains(ready, "reads emulated at 953.7 MiB/s") {
		t.Errorf("ready line %q does not say the draft works while weights stream, read at 1 GB/s", ready)
	}
	checkCompletions(t, addr, prompts, want, n, 2)
	stopServe(t, addr, done)

	var errOut strings.Builder
	code := run([]string{"serve", "--addr", "127.0.0.1:0", "--model", gguf, "--budget", "1KiB"}, io.Discard, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "needs at least") {
		t.Errorf("--budget 1KiB: exit %d, %q; want a failure saying what the model needs", code, errOut.String())
	}
	errOut.Reset()
	code = run([]string{"serve", "--addr", "127.0.0.1:0", "--model", gguf, "--io-bandwidth", "1GB/s"}, io.Discard, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "add --budget") {
		t.Errorf("--io-bandwidth without --budget: exit %d, %q; want a usage error asking for --budget", code, errOut.String())
	}
}

// TestServePrefixCache: with the default --prefix-cache a prompt sent
// again after another client's reuses all its tokens but the last; with
// --prefix-cache 0 the lane keeps one sequence, the other client's, and
// the prompt is prefilled again.
func TestServePrefixCache(t *testing.T) {
	for _, cache := range []string{"512MiB", "0"} {
		addr, _, done, _ := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--ctx", "256", "--prefix-cache", cache)
		complete := func(prompt string) (promptTokens int) {
			t.Helper()
			resp, err := http.Post(addr+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":4,"temperature":0}`, prompt)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var r struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d: %v", resp.StatusCode, err)
			}
			return r.Usage.PromptTokens
		}
		reused := func() int {
			t.Helper()
			m := regexp.MustCompile(`(?m)^tandem_prefix_reused_tokens_total (\d+)$`).FindStringSubmatch(getMetrics(t, addr))
			if m == nil {
				t.Fatal("no tandem_prefix_reused_tokens_total")
			}
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		const a = "Once upon a time there was a little cat who liked to play in the sun"
		complete(a)
		complete("Tom had a red ball.")
		before := reused()
		n := complete(a)
		got := reused() - before
		if keep := cache != "0"; keep && got != n-1 || !keep && got >= n/2 {
			t.Errorf("--prefix-cache %s: the prompt again reused %d of its %d tokens", cache, got, n)
		}
		stopServe(t, addr, done)
	}
}

// TestServeTrimBelow: when the machine's available memory is below
// --trim-below, serve gives back the KV memory the lane keeps for prefix
// reuse and says so; above it, the kept rows stay.
func TestServeTrimBelow(t *testing.T) {
	defer func(d time.Duration) { memoryCheckEvery = d }(memoryCheckEvery)
	memoryCheckEvery = 10 * time.Millisecond
	prompts, want := greedyAnswers(t, 1, 8)
	for _, floor := range []string{"1KiB", "1000000TiB"} { // always above it, always below
		addr, _, done, after := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--ctx", "256", "--trim-below", floor)
		checkCompletion(t, addr, prompts[0], 8, want[0], "a completion")
		kv := func() (inUse, held float64) {
			t.Helper()
			for _, line := range strings.Split(getMetrics(t, addr), "\n") {
				fmt.Sscanf(line, `tandem_memory_bytes{kind="kv"} %g`, &inUse)
				fmt.Sscanf(line, `tandem_memory_bytes{kind="kv_held"} %g`, &held)
			}
			return inUse, held
		}
		trims := floor != "1KiB"
		deadline := time.Now().Add(10 * time.Second)
		time.Sleep(10 * memoryCheckEvery)
		for inUse, held := kv(); trims && held > inUse && time.Now().Before(deadline); inUse, held = kv() {
			time.Sleep(memoryCheckEvery)
		}
		if inUse, held := kv(); trims && held != inUse || !trims && held <= inUse {
			t.Errorf("--trim-below %s: the lane holds %g bytes of KV memory with %g in use", floor, held, inUse)
		}
		stopServe(t, addr, done)
		if said := strings.Contains(after(), "released"); said != trims {
			t.Errorf("--trim-below %s: serve said it released kept KV memory: %v, want %v", floor, said, trims)
		}
	}
	var errOut strings.Builder
	if code := run([]string{"serve", "--addr", "127.0.0.1:0", "--trim-below", "lots"}, io.Discard, &errOut); code == 0 || !strings.Contains(errOut.String(), "--trim-below") {
		t.Errorf("--trim-below lots: exit %d, %q; want a usage error naming the flag", code, errOut.String())
	}
}
