package mobile

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

// recorder is a Go TokenCallback, as an app's Kotlin one would be.
type recorder struct {
	mu       sync.Mutex
	tokens   []string
	segments []string
	first    chan struct{} // closed at the first OnToken
	once     sync.Once
}

func newRecorder() *recorder { return &recorder{first: make(chan struct{})} }

func (r *recorder) OnToken(text string) {
	r.mu.Lock()
	r.tokens = append(r.tokens, text)
	r.mu.Unlock()
	r.once.Do(func() { close(r.first) })
}

func (r *recorder) OnSegment(text string) {
	r.mu.Lock()
	r.segments = append(r.segments, text)
	r.mu.Unlock()
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.tokens, "")
}

func newEngine(t *testing.T, cfg string) *Engine {
	t.Helper()
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func generate(t *testing.T, e *Engine, req string, cb TokenCallback) result {
	t.Helper()
	out, err := e.Generate(req, cb)
	if err != nil {
		t.Fatal(err)
	}
	var r result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("result %q: %v", out, err)
	}
	return r
}

// greedyRecord is a line of ../shared/testdata/*.greedy.jsonl.
type greedyRecord = testutil.Greedy

func firstRecord(t *testing.T, name string) greedyRecord {
	return testutil.GreedyRecords(t, name)[0]
}

// referenceText decodes the reference ids after the prompt, as the
// scheduler's primed decoder does.
func referenceText(t *testing.T, tok *tokenizer.Tokenizer, rec greedyRecord, n int) string {
	t.Helper()
	dec := tok.NewDecoder()
	for _, id := range rec.PromptIDs {
		dec.Next(id)
	}
	var b strings.Builder
	for _, id := range rec.GeneratedIDs[:n] {
		b.WriteString(dec.Next(id))
	}
	return b.String() + dec.Flush()
}

// TestGenerateMatchesReference: greedy generation through the facade
// streams, token by token, the reference implementation's text, for a
// GGUF with its own vocabulary and a llama2.c model with tokenizer.bin,
// resident and streamed under the smallest budget.
func TestGenerateMatchesReference(t *testing.T) {
	const n = 40
	draft := `, "draft": "` + testutil.Model(t, "llama2xs_model.bin") + `", "context": 256`
	for _, tc := range []struct {
		name, cfg, model, refs, tok string
	}{
		{"gguf", `{"model": %q, "threads": 1}`, "stories260K.gguf", "stories260K.greedy.jsonl", "stories260K.gguf"},
		{"gguf streamed", `{"model": %q, "lanes": [1, 1], "budget": "min"}`, "stories260K.gguf", "stories260K.greedy.jsonl", "stories260K.gguf"},
		{"llama2c", `{"model": %q, "tokenizer": %q, "threads": 2}`, "llama2xs_model.bin", "llama2xs.greedy.jsonl", "tok512.bin"},
		// Speculative lanes: llama2xs drafts for stories260K, whose output
		// it must not change.
		{"tree", `{"model": %q, "tokenizer": %q` + draft + `}`, "stories260K.bin", "stories260K.greedy.jsonl", "tok512.bin"},
		{"sd streamed", `{"model": %q, "tokenizer": %q, "mode": "sd", "lanes": [1, 1], "budget": "min", "draft_context": 48` + draft + `}`, "stories260K.bin", "stories260K.greedy.jsonl", "tok512.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fmt.Sprintf(tc.cfg, testutil.Model(t, tc.model))
			if strings.Count(tc.cfg, "%q") == 2 {
				cfg = fmt.Sprintf(tc.cfg, testutil.Model(t, tc.model), testutil.Model(t, tc.tok))
			}
			tok, err := tokenizer.Load(testutil.Model(t, tc.tok))
			if err != nil {
				t.Fatal(err)
			}
			rec := firstRecord(t, tc.refs)
			want := referenceText(t, tok, rec, n)
			e := newEngine(t, cfg)
			cb := newRecorder()
			r := generate(t, e, fmt.Sprintf(`{"prompt": %q, "max_tokens": %d, "temperature": 0, "id": "ref"}`, rec.Prompt, n), cb)
			if r.Text != want {
				t.Errorf("text %q\nwant %q", r.Text, want)
			}
			if got := cb.text(); got != r.Text {
				t.Errorf("callback streamed %q, result says %q", got, r.Text)
			}
			// A reader that falls behind gets merged events ("one or more
			// tokens"), and on this model all of them can come before the
			// first callback, so one call is allowed here; TestCancel shows
			// text arriving while generation goes on.
			if len(cb.tokens) == 0 {
				t.Errorf("no callback calls")
			}
			if r.ID != "ref" || r.Finish != "length" || r.CompletionTokens != n || r.PromptTokens != len(rec.PromptIDs) {
				t.Errorf("result %+v", r)
			}
			var st statsJSON
			if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tc.name, "streamed") && (!strings.HasPrefix(st.Memory, "streamed") || len(st.Lanes) != 2) {
				t.Errorf("stats: memory %q, %d lanes", st.Memory, len(st.Lanes))
			}
			for _, l := range st.Lanes {
				// A lane that served a request read its weights from the
				// file and held some when they stream, and none when
				// resident.
				streamed := strings.Contains(tc.name, "streamed")
				if l.Tokens > 0 && ((l.WeightsReadBytes > 0) != streamed || (l.WeightsPeakBytes > 0) != streamed) {
					t.Errorf("stats: lane %s read %d weight bytes and held at most %d (streamed %v)", l.Name, l.WeightsReadBytes, l.WeightsPeakBytes, streamed)
				}
			}
			var laneTokens uint64
			for _, l := range st.Lanes {
				laneTokens += l.Tokens
			}
			if st.StalledMs != 0 || !strings.Contains(e.Stats(), `"stalled_ms":0`) {
				t.Errorf("stats: stalled %v ms with nothing waiting", st.StalledMs)
			}
			// Each token followed at least the prompt's BOS.
			if st.Attended < st.Tokens {
				t.Errorf("stats: %d tokens followed %d tokens of context in all", st.Tokens, st.Attended)
			}
			if laneTokens != st.Tokens || st.Tokens < uint64(n) {
				t.Errorf("stats: the lanes generated %d tokens, the engine %d, the request %d", laneTokens, st.Tokens, n)
			}
			if js := e.Stats(); strings.Contains(tc.name, "streamed") && strings.Count(js, `"much_slower":false`) != 2 {
				t.Errorf("stats: want much_slower false on both alike lanes: %s", js)
			}
			if strings.Contains(cfg, `"draft"`) {
				var passes, tokens int
				for _, l := range st.Lanes {
					if l.Spec == nil {
						t.Fatalf("lane %s has no speculative stats", l.Name)
					}
					passes, tokens = passes+l.Spec.TargetPasses, tokens+l.Spec.Tokens
					if l.Spec.Undrafted > l.Spec.TargetPasses {
						t.Errorf("lane %s: %d passes over the root alone of %d", l.Name, l.Spec.Undrafted, l.Spec.TargetPasses)
					}
				}
				// Only the tokens handed out count: a last pass may emit
				// past max_tokens, and the rest is dropped.
				if tokens != n || passes == 0 || passes >= n {
					t.Errorf("speculative lanes: %d tokens in %d target passes", tokens, passes)
				}
			}
		})
	}
}

// TestEmbeddedDefault: an empty config runs the embedded model, and
// concurrent requests all stream their text.
func TestEmbeddedDefault(t *testing.T) {
	e := newEngine(t, "")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			cb := newRecorder()
			out, err := e.Generate(fmt.Sprintf(`{"prompt": "Once upon a time", "max_tokens": 12, "seed": %d}`, i), cb)
			if err != nil {
				errs[i] = err
				return
			}
			var r result
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				errs[i] = err
				return
			}
			if r.CompletionTokens == 0 || r.Text != cb.text() || !strings.HasPrefix(r.ID, "req-") {
				errs[i] = fmt.Errorf("result %+v, streamed %q", r, cb.text())
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var st statsJSON
	if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Completed != 3 || st.Tokens == 0 || len(st.Lanes) != 1 || st.Model == "" || st.InFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestMaxQueue: max_queue reaches the scheduler. With one sequence slot
// and room for one waiting request, eight requests arriving together
// cannot all be taken: the rest fail at once with "queue full", and the
// taken ones complete.
func TestMaxQueue(t *testing.T) {
	e := newEngine(t, `{"max_seqs": 1, "max_batch": 1, "max_queue": 1}`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	full, done := 0, 0
	for range 8 {
		wg.Go(func() {
			_, err := e.Generate(`{"prompt": "Once upon a time", "max_tokens": 256}`, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				done++
			case strings.Contains(err.Error(), "queue full"):
				full++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if full == 0 || done == 0 || full+done != 8 {
		t.Errorf("%d completed, %d refused for a full queue; want some of each", done, full)
	}
}

// TestEmbeddedCalibration: the embedded model schedules with the
// calibration it ships with, from the first request. Uncalibrated, the
// predicted length is the prompt's length in tokens, under 40 for both
// prompts here.
func TestEmbeddedCalibration(t *testing.T) {
	e := newEngine(t, "")
	predict := func(prompt string) float64 {
		return generate(t, e, fmt.Sprintf(`{"prompt": %q, "max_tokens": 200, "temperature": 0}`, prompt), nil).Uncertainty
	}
	closed := predict("Is the red ball in the box?")
	open := predict("Tell me everything about the little dog and the big tree, and then describe what might happen next, and why?")
	if open < closed+50 {
		t.Errorf("predicted %.1f tokens for a closed question, %.1f for an open, multi-part request: the shipped calibration is not in use", closed, open)
	}
}

// TestEmbeddedDraft: the embedded draft ("draft": "default") speculates
// for the embedded model without changing its greedy text.
func TestEmbeddedDraft(t *testing.T) {
	const req = `{"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}`
	want := generate(t, newEngine(t, `{"threads": 1}`), req, newRecorder()).Text
	got := generate(t, newEngine(t, `{"threads": 1, "draft": "default"}`), req, newRecorder()).Text
	if got != want || want == "" {
		t.Errorf("with the draft %q\nalone          %q", got, want)
	}
}

// TestCancel: Cancel ends a running generation, which returns normally
// with finish "cancelled" and what it had generated.
func TestCancel(t *testing.T) {
	e := newEngine(t, `{"threads": 1}`)
	cb := newRecorder()
	type outcome struct {
		r   result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		out, err := e.Generate(`{"prompt": "Once upon a time", "max_tokens": 100000, "id": "long", "temperature": 0}`, cb)
		var r result
		if err == nil {
			err = json.Unmarshal([]byte(out), &r)
		}
		done <- outcome{r, err}
	}()
	<-cb.first
	if !e.Cancel("long") {
		t.Fatal("Cancel did not find the running request")
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.r.Finish != "cancelled" || o.r.CompletionTokens == 0 || o.r.CompletionTokens >= e.sc.Context() {
		t.Errorf("cancelled result %+v", o.r)
	}
	if e.Cancel("long") || e.Cancel("never-existed") {
		t.Error("Cancel found a finished or unknown request")
	}
}

// TestSegments: a segmented request returns at each line with OnSegment,
// resumes for the next, and Cancel drops it while parked.
func TestSegments(t *testing.T) {
	e := newEngine(t, fmt.Sprintf(`{"model": %q, "threads": 1}`, testutil.Model(t, "stories260K.gguf")))
	cb := newRecorder()
	r := generate(t, e, `{"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "segment": {"regex": "[.!?]"}, "id": "plan"}`, cb)
	if r.Finish != "segment" || !r.Resumable || len(cb.segments) != 1 || cb.segments[0] != r.Text || !strings.ContainsAny(r.Text, ".!?") {
		t.Fatalf("first segment: %+v, segments %q", r, cb.segments)
	}
	cb2 := newRecorder()
	out, err := e.Resume("plan", `{"deadline_ms": 60000}`, cb2)
	if err != nil {
		t.Fatal(err)
	}
	var r2 result
	if err := json.Unmarshal([]byte(out), &r2); err != nil {
		t.Fatal(err)
	}
	if r2.Finish != "segment" || r2.Text == "" || r2.Text != cb2.segments[0] || r2.DeadlineMet == nil || r2.GeneratedTotal <= r.GeneratedTotal {
		t.Fatalf("second segment: %+v", r2)
	}
	if !e.Cancel("plan") {
		t.Fatal("Cancel did not drop the parked request")
	}
	if _, err := e.Resume("plan", "", nil); !errors.Is(err, sched.ErrNotParked) {
		t.Errorf("resume after cancel: %v", err)
	}
}

func TestBadConfig(t *testing.T) {
	stories := testutil.Model(t, "stories260K.gguf")
	for _, tc := range []struct {
		name, cfg, want string
	}{
		{"malformed", `{"threads": `, "malformed JSON"},
		{"not an object", `[1]`, "want a JSON object"},
		{"unknown field", `{"modle": "x.gguf"}`, `unknown field "modle"`},
		{"wrong type", `{"threads": "four"}`, `field "threads" has the wrong type`},
		{"trailing data", `{} {}`, "unexpected data"},
		{"missing model", `{"model": "/data/user/0/app/files/none.gguf"}`, "Context.getFilesDir()"},
		{"not a model", fmt.Sprintf(`{"model": %q}`, testutil.Testdata(t, "README.md")), "README.md"},
		{"llama2c without tokenizer", fmt.Sprintf(`{"model": %q}`, testutil.Model(t, "llama2xs_model.bin")), "set tokenizer"},
		{"missing tokenizer", `{"tokenizer": "/nowhere/tok.bin"}`, `tokenizer "/nowhere/tok.bin"`},
		{"another model's tokenizer", fmt.Sprintf(`{"model": %q, "tokenizer": %q}`, stories, testutil.Model(t, "tokenizer.bin")), "do not belong together"},
		{"a smaller tokenizer", fmt.Sprintf(`{"model": %q, "tokenizer": %q}`, testutil.Model(t, "llama-2-tiny-random.gguf"), testutil.Model(t, "tok512.bin")), "set tokenizer to the model's own"},
		{"threads and lanes", `{"threads": 2, "lanes": [1, 1]}`, "not both"},
		{"bad lane", `{"lanes": [1, 0]}`, "lanes[1] = 0"},
		{"negative threads", `{"threads": -1}`, "threads -1"},
		{"missing draft", `{"draft": "/nowhere/d.gguf"}`, `draft "/nowhere/d.gguf"`},
		{"draft of another vocabulary", fmt.Sprintf(`{"model": %q, "draft": %q}`, stories, testutil.Model(t, "llama-2-tiny-random.gguf")), "draft: "},
		{"draft without vocabulary", fmt.Sprintf(`{"model": %q, "draft": %q}`, stories, testutil.Model(t, "llama2xs_model.bin")), "set draft_tokenizer"},
		{"mode without draft", `{"mode": "sd"}`, "needs a draft"},
		{"unknown mode", `{"draft": "default", "mode": "bild"}`, "want tree or sd"},
		{"draft tokenizer without draft", `{"draft_tokenizer": "tok.bin"}`, "needs a draft"},
		{"draft context without draft", `{"draft_context": 64}`, "needs a draft"},
		{"draft context of one", `{"draft": "default", "draft_context": 1}`, "draft_context 1"},
		{"kv type", `{"kv_type": "q4_0"}`, "kv_type"},
		{"prefix cache", `{"prefix_cache": "a lot"}`, "prefix_cache"},
		{"policy", `{"policy": "random"}`, "unknown policy"},
		{"context", `{"context": -5}`, "context -5"},
		{"context too short", `{"context": 2}`, "at least 16"},
		{"budget on the embedded model", `{"budget": "64MiB"}`, "embedded default model has no file"},
		{"budget unit", fmt.Sprintf(`{"model": %q, "budget": "12 parsecs"}`, stories), "unknown unit"},
		{"budget too small", fmt.Sprintf(`{"model": %q, "budget": "1KiB"}`, stories), "needs at least"},
		{"context too long", `{"context": 100000000}`, "context"},
		{"negative queue", `{"max_queue": -1}`, "max_queue -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEngine(tc.cfg)
			if err == nil {
				e.Close()
				t.Fatalf("config %s accepted", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "mobile: ") {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestBudgetAuto(t *testing.T) {
	stories := testutil.Model(t, "stories260K.gguf")
	f, err := weights.Open(stories)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer func(old func() (uint64, error)) { availableMemory = old }(availableMemory)
	for _, tc := range []struct {
		name  string
		avail uint64
		err   error
		want  string // memory note prefix, or the error
	}{
		{"plenty", 8 << 30, nil, "auto"},
		{"tight", 800 << 10, nil, "streamed"},
		{"too little", 1 << 10, nil, "needs at least"},
		{"unreadable", 0, errors.New("no /proc/meminfo"), "give a size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			availableMemory = func() (uint64, error) { return tc.avail, tc.err }
			plan, err := planMemory(f, "auto", 1)
			got := plan.Note
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("auto with %d bytes available: %q, want %q", tc.avail, got, tc.want)
			}
			if tc.name == "plenty" && plan.Stream != nil {
				t.Error("the whole model fits, but it streams")
			}
			if tc.name == "tight" && (plan.Stream == nil || plan.Stream.Budget != uint64(float64(tc.avail)*autoShare)) {
				t.Errorf("tight: stream %+v", plan.Stream)
			}
		})
	}
}

func TestBadRequest(t *testing.T) {
	e := newEngine(t, `{"threads": 1, "max_tokens": 8}`)
	for _, tc := range []struct {
		name, req, want string
	}{
		{"empty", ``, "prompt is required"},
		{"malformed", `{"prompt": "x",}`, "malformed JSON"},
		{"unknown field", `{"prompt": "x", "n": 2}`, `unknown field "n"`},
		{"field in another case", `{"Prompt": "x"}`, `unknown field "Prompt": field names are case-sensitive (did you mean "prompt"?)`},
		{"field twice", `{"prompt": "x", "prompt": "y"}`, `field "prompt" appears twice`},
		{"deadline as sent", `{"prompt": "x", "deadline_ms": 86400001}`, "deadline_ms=86400001:"},
		{"wrong type", `{"prompt": "x", "max_tokens": "many"}`, `field "max_tokens" has the wrong type`},
		{"out of range", `{"prompt": "x", "temperature": 1e400}`, `field "temperature": 1e400 is out of range`},
		{"max_tokens", `{"prompt": "x", "max_tokens": 0}`, "max_tokens=0"},
		{"min_tokens", `{"prompt": "x", "min_tokens": 9}`, "min_tokens=9"},
		{"temperature", `{"prompt": "x", "temperature": 3}`, "temperature=3"},
		{"top_p", `{"prompt": "x", "top_p": 0}`, "top_p=0"},
		{"deadline", `{"prompt": "x", "deadline_ms": -1}`, "deadline_ms=-1"},
		{"priority", `{"prompt": "x", "priority": 11}`, "priority"},
		{"segment name", `{"prompt": "x", "segment": "paragraph"}`, "built-in delimiter"},
		{"segment regex", `{"prompt": "x", "segment": {"regex": "a*"}}`, "empty string"},
		{"segment object", `{"prompt": "x", "segment": {"re": "x"}}`, "segment must be"},
		{"stop", `{"prompt": "x", "stop": [""]}`, "stop"},
		{"long id", fmt.Sprintf(`{"prompt": "x", "id": %q}`, strings.Repeat("i", 200)), "at most 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := e.Generate(tc.req, nil)
			if err == nil {
				t.Fatalf("request %s accepted: %s", tc.req, out)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "mobile: ") {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ id, opts, want string }{
		{"", "", "empty id"},
		{"nobody", "", "no parked request"},
		{"nobody", `{"deadline_ms": 0}`, "deadline_ms=0"},
		{"nobody", `{"max_tokens": -2}`, "max_tokens=-2"},
		{"nobody", `{"stream": true}`, `unknown field "stream"`},
	} {
		if _, err := e.Resume(tc.id, tc.opts, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Resume(%q, %q): %v, want %q", tc.id, tc.opts, err, tc.want)
		}
	}
}

// TestDuplicateID: a second request with a running request's id is
// refused, not merged.
func TestDuplicateID(t *testing.T) {
	e := newEngine(t, `{"threads": 1}`)
	cb := newRecorder()
	done := make(chan error, 1)
	go func() {
		_, err := e.Generate(`{"prompt": "Once upon a time", "max_tokens": 100000, "id": "dup"}`, cb)
		done <- err
	}()
	<-cb.first
	if _, err := e.Generate(`{"prompt": "Hi", "id": "dup"}`, nil); err == nil || !strings.Contains(err.Error(), "already generating") {
		t.Errorf("duplicate id: %v", err)
	}
	e.Cancel("dup")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestClose: Close cancels what runs, is idempotent, and later calls
// fail with a clear error.
func TestClose(t *testing.T) {
	e, err := NewEngine(`{"threads": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	cb := newRecorder()
	done := make(chan string, 1)
	go func() {
		out, err := e.Generate(`{"prompt": "Once upon a time", "max_tokens": 100000}`, cb)
		if err != nil {
			out = err.Error()
		}
		done <- out
	}()
	<-cb.first
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if out := <-done; !strings.Contains(out, `"finish":"cancelled"`) {
		t.Errorf("generation running at Close: %s", out)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := e.Generate(`{"prompt": "x"}`, nil); err == nil || !strings.Contains(err.Error(), "engine is closed") {
		t.Errorf("Generate after Close: %v", err)
	}
	if !strings.Contains(e.Stats(), `"closed":true`) {
		t.Errorf("stats after Close: %s", e.Stats())
	}
}

// cancelOnSegment cancels its request from OnSegment, as a UI thread may
// as the segment is released.
type cancelOnSegment struct {
	e     *Engine
	found bool
}

func (c *cancelOnSegment) OnToken(string)   {}
func (c *cancelOnSegment) OnSegment(string) { c.found = c.e.Cancel("plan") }

func TestCancelAsTheSegmentIsReleasedDropsIt(t *testing.T) {
	e := newEngine(t, `{"threads": 1}`)
	cb := &cancelOnSegment{e: e}
	r := generate(t, e, `{"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "segment": {"regex": "[.!?]"}, "id": "plan"}`, cb)
	if !cb.found || r.Finish != "cancelled" || r.Resumable || r.Text == "" {
		t.Errorf("Cancel in OnSegment found it: %v; result %+v; want finish cancelled with the segment's text, not resumable", cb.found, r)
	}
	if _, err := e.Resume("plan", "", nil); err == nil || !strings.Contains(err.Error(), "no parked request") {
		t.Errorf("resume after Cancel: %v; want no parked request", err)
	}
}

func TestAssignedIDsSkipParkedRequests(t *testing.T) {
	e := newEngine(t, `{"threads": 1}`)
	r := generate(t, e, `{"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "segment": {"regex": "[.!?]"}, "id": "req-1"}`, nil)
	if r.Finish != "segment" {
		t.Fatalf("the first request did not park: %+v", r)
	}
	if r := generate(t, e, `{"prompt": "Hello", "max_tokens": 4}`, nil); r.ID == "req-1" || r.ID == "" || r.Finish != "length" {
		t.Errorf("request without an id: %+v; want its own id", r)
	}
	if _, err := e.Generate(`{"prompt": "Hello", "id": "req-1"}`, nil); err == nil || !strings.Contains(err.Error(), "parked") {
		t.Errorf("reusing a parked request's id: %v; want an error that says it is parked", err)
	}
}

// Close from two goroutines while a request generates: neither returns
// before the engine is closed (run with -race: the error was read
// unlocked).
func TestConcurrentCloseWaitsForTheFirst(t *testing.T) {
	for range 20 {
		e, err := NewEngine(`{"threads": 1}`)
		if err != nil {
			t.Fatal(err)
		}
		cb := newRecorder()
		go e.Generate(`{"prompt": "Once upon a time", "max_tokens": 100000}`, cb)
		<-cb.first
		var wg sync.WaitGroup
		var early atomic.Int32
		for range 2 {
			wg.Go(func() {
				if err := e.Close(); err != nil {
					t.Error(err)
				}
				select {
				case <-e.closeDone:
				default:
					early.Add(1)
				}
			})
		}
		wg.Wait()
		if early.Load() > 0 {
			t.Fatalf("a Close returned before the first had closed the engine")
		}
	}
}

// Generate calls that race with Close end as cancelled, or are refused as
// closed: never another error.
func TestGenerateRacingCloseIsCancelled(t *testing.T) {
	for round := range 50 {
		e, err := NewEngine(`{"threads": 1}`)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				<-start
				out, err := e.Generate(`{"prompt": "Once upon a time", "max_tokens": 50}`, nil)
				if err != nil && !strings.Contains(err.Error(), "engine is closed") {
					t.Errorf("round %d: %v", round, err)
				}
				if err == nil && !strings.Contains(out, `"finish":`) {
					t.Errorf("round %d: result %s", round, out)
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round%20) * 20 * time.Microsecond)
		e.Close()
		wg.Wait()
	}
}

// TestPrefixReuse: a prompt sent again starts from the first answer's KV
// rows (stats' reused_tokens, overall and per lane) and gives the same
// text; "prefix_reuse": false prefills it whole.
func TestPrefixReuse(t *testing.T) {
	rec := firstRecord(t, "stories260K.greedy.jsonl")
	for _, on := range []bool{true, false} {
		e := newEngine(t, fmt.Sprintf(`{"model": %q, "threads": 1, "prefix_reuse": %v}`, testutil.Model(t, "stories260K.gguf"), on))
		req := fmt.Sprintf(`{"prompt": %q, "max_tokens": 16, "temperature": 0}`, rec.Prompt)
		first := generate(t, e, req, newRecorder())
		if again := generate(t, e, req, newRecorder()); again.Text != first.Text {
			t.Errorf("prefix_reuse %v: the same prompt gave %q, then %q", on, first.Text, again.Text)
		}
		var st statsJSON
		if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
			t.Fatal(err)
		}
		// The second request reuses every prompt token but the last.
		want := uint64(0)
		if on {
			want = uint64(len(rec.PromptIDs) - 1)
		}
		if st.ReusedTokens != want || len(st.Lanes) != 1 || st.Lanes[0].ReusedTokens != want {
			t.Errorf("prefix_reuse %v: %d tokens reused (lanes %+v), want %d", on, st.ReusedTokens, st.Lanes, want)
		}
		// Nothing runs, but the lane holds the freed sequence's buffer.
		if l := st.Lanes[0]; l.KVBytes != 0 || l.KVHeldBytes <= 0 {
			t.Errorf("prefix_reuse %v: %d KV bytes in use, %d held; want none and some", on, l.KVBytes, l.KVHeldBytes)
		}
	}
}

// TestTrimMemory: trimMemory (onTrimMemory's call) gives back the KV
// memory the lane holds after a request, the same prompt afterwards
// prefills whole and gives the same text, and a closed engine refuses.
func TestTrimMemory(t *testing.T) {
	rec := firstRecord(t, "stories260K.greedy.jsonl")
	e := newEngine(t, fmt.Sprintf(`{"model": %q, "threads": 1}`, testutil.Model(t, "stories260K.gguf")))
	req := fmt.Sprintf(`{"prompt": %q, "max_tokens": 16, "temperature": 0}`, rec.Prompt)
	first := generate(t, e, req, newRecorder())
	stats := func() statsJSON {
		var st statsJSON
		if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	held := stats().Lanes[0].KVHeldBytes
	n, err := e.TrimMemory()
	if err != nil || n != held || held <= 0 {
		t.Fatalf("TrimMemory: %d bytes released of %d held, %v", n, held, err)
	}
	if st := stats(); st.Lanes[0].KVHeldBytes != 0 {
		t.Errorf("%d KV bytes held after TrimMemory, want none", st.Lanes[0].KVHeldBytes)
	}
	if again := generate(t, e, req, newRecorder()); again.Text != first.Text || stats().ReusedTokens != 0 {
		t.Errorf("after TrimMemory: %q with %d tokens reused, want %q with none", again.Text, stats().ReusedTokens, first.Text)
	}
	e.Close()
	if _, err := e.TrimMemory(); err == nil {
		t.Error("TrimMemory on a closed engine succeeded")
	}
}

// TestPrefixCache: with the default prefix_cache a prompt asked again
// after another reuses all its tokens but the last; with "0" the lane
// keeps only the other prompt's rows and prefills it again.
func TestPrefixCache(t *testing.T) {
	model := testutil.Model(t, "stories260K.gguf")
	for _, cache := range []string{"", "0"} {
		e := newEngine(t, fmt.Sprintf(`{"model": %q, "threads": 1, "prefix_cache": %q}`, model, cache))
		ask := func(prompt string) int {
			return generate(t, e, fmt.Sprintf(`{"prompt": %q, "max_tokens": 4, "temperature": 0}`, prompt), newRecorder()).PromptTokens
		}
		reused := func() uint64 {
			var st statsJSON
			if err := json.Unmarshal([]byte(e.Stats()), &st); err != nil {
				t.Fatal(err)
			}
			return st.ReusedTokens
		}
		const a = "Once upon a time there was a little cat who liked to play in the sun"
		ask(a)
		ask("Tom had a red ball.")
		before := reused()
		n := ask(a)
		got := int(reused() - before)
		if keep := cache == ""; keep && got != n-1 || !keep && got >= n/2 {
			t.Errorf("prefix_cache %q: the prompt again reused %d of its %d tokens", cache, got, n)
		}
	}
}
