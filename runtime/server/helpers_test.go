package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sample"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

const testCtx = 512

// fixture is a server on stories260K with its engines, for one test.
type fixture struct {
	srv     *Server
	http    *httptest.Server
	sc      *sched.Scheduler
	engines []*sched.ModelEngine
	file    *weights.File
	tok     *tokenizer.Tokenizer
}

type fixtureOpts struct {
	cfg     sched.Config
	srv     Config // Model defaults to stories260K
	lanes   int
	maxSeqs int
	cpus    map[int]cpuset.Set // lanes pinned to CPUs, by index
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromMetadata(&f.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	if o.lanes == 0 {
		o.lanes = 1
	}
	if o.maxSeqs == 0 {
		o.maxSeqs = 16
	}
	fx := &fixture{file: f, tok: tok}
	var lanes []sched.Lane
	for i := range o.lanes {
		m, err := model.Load(f, model.Options{Threads: 1, CPUs: o.cpus[i]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		e, err := sched.NewModelEngine(m, sched.ModelEngineOptions{Name: fmt.Sprintf("cpu%d", i), MaxSeqs: o.maxSeqs, Context: testCtx})
		if err != nil {
			t.Fatal(err)
		}
		fx.engines = append(fx.engines, e)
		lanes = append(lanes, sched.Lane{Engine: e})
	}
	if fx.sc, err = sched.New(o.cfg, nil, lanes...); err != nil {
		t.Fatal(err)
	}
	if o.srv.Model == "" {
		o.srv.Model = "stories260K"
	}
	fx.srv = New(o.srv)
	fx.srv.Ready(fx.sc, tok)
	fx.http = httptest.NewServer(fx.srv)
	t.Cleanup(func() {
		fx.http.Close()
		fx.sc.Shutdown(context.Background())
	})
	return fx
}

func (fx *fixture) live() int {
	n := 0
	for _, e := range fx.engines {
		n += e.Live()
	}
	return n
}

// reference is the greedy continuation of prompt as the server should
// render it: the plain decode loop, stopping at EOS or BOS.
func (fx *fixture) reference(t testing.TB, prompt string, maxTokens int) (string, int) {
	t.Helper()
	m, err := model.Load(fx.file, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache, err := m.NewCache(testCtx, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := fx.tok.Encode(prompt, tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := spec.Generate(context.Background(), m, cache, ids, spec.GenOptions{MaxTokens: maxTokens,
		Sampler: sample.New(sample.Options{}),
		Stop:    func(id int32) bool { return id == fx.tok.EOS() || id == fx.tok.BOS() }})
	if err != nil {
		t.Fatal(err)
	}
	gen := res.Ids
	if res.Reason == spec.StopToken {
		gen = gen[:len(gen)-1]
	}
	return fx.tok.DecodeAfter(ids, gen), len(gen)
}

// post sends a JSON body and returns the status, headers and body.
func post(t testing.TB, url string, body any) (int, http.Header, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	resp, err := http.Post(url, "application/json", r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// completion is the non-streaming response shape (both endpoints).
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Tandem *tandemInfo `json:"tandem"`
	Error  *apiError   `json:"error"`
}

func parse(t testing.TB, data []byte) completion {
	t.Helper()
	var c completion
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("response %q: %v", data, err)
	}
	return c
}

// sse reads a server-sent event stream: the chunks and whether it ended
// with [DONE].
func sse(t testing.TB, r io.Reader) ([]completion, bool) {
	t.Helper()
	var out []completion
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		if data == "[DONE]" {
			if sc.Scan() && sc.Text() != "" {
				t.Errorf("data after [DONE]: %q", sc.Text())
			}
			return out, true
		}
		out = append(out, parse(t, []byte(data)))
	}
	return out, false
}

// streamText concatenates the text of completion or chat chunks.
func streamText(chunks []completion) string {
	var b strings.Builder
	for _, c := range chunks {
		for _, ch := range c.Choices {
			b.WriteString(ch.Text)
			if ch.Delta != nil && ch.Delta.Content != nil {
				b.WriteString(*ch.Delta.Content)
			}
		}
	}
	return b.String()
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// gateEngine is a test double whose steps wait for a release, so a test
// can hold requests in the batch and the queue.
type gateEngine struct {
	mu      sync.Mutex
	seqs    map[sched.SeqID]bool
	next    sched.SeqID
	gate    chan struct{}
	stepped chan struct{}
}

func newGateEngine() *gateEngine {
	return &gateEngine{seqs: map[sched.SeqID]bool{}, gate: make(chan struct{}), stepped: make(chan struct{}, 1)}
}

func (e *gateEngine) Info() sched.EngineInfo {
	return sched.EngineInfo{Name: "gate", MaxSeqs: 4, Context: 64, SeqBytes: 1, Threads: 1}
}

func (e *gateEngine) Start([]int32, *sample.Sampler, string) (sched.SeqID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.next++
	e.seqs[e.next] = true
	return e.next, nil
}

func (e *gateEngine) Free(id sched.SeqID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.seqs, id)
	return nil
}

func (e *gateEngine) Step(ctx context.Context, members []sched.Member, out []sched.StepOut) error {
	select {
	case e.stepped <- struct{}{}:
	default:
	}
	<-e.gate
	for i := range members {
		out[i] = sched.StepOut{Tokens: []int32{5}}
	}
	return nil
}
