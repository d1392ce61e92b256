package mobile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"

	"github.com/tandem-llm/tandem/internal/jsonerr"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// TokenCallback receives a generation's text as it is produced. An app
// implements it in Kotlin or Java. Its methods are called on the thread
// that called Generate or Resume (a background thread: post to the UI
// thread to show the text), one at a time, in order.
type TokenCallback interface {
	// OnToken receives the text of newly generated tokens (one or more
	// tokens; text is held back while it may begin a stop string).
	OnToken(text string)
	// OnSegment receives a completed segment's whole text, for requests
	// with "segment", just before Generate (or Resume) returns with
	// finish "segment".
	OnSegment(text string)
}

// request is Generate's JSON: the server's completion request, minus
// what a single in-process caller has no use for (the shared fields are
// sched.Params, checked as the server checks them).
type request struct {
	sched.Params
	ID     string   `json:"id"`
	Prompt *string  `json:"prompt"`
	Stop   []string `json:"stop"`
}

// result is what Generate and Resume return, as JSON.
type result struct {
	ID               string  `json:"id"`
	Text             string  `json:"text"`
	Finish           string  `json:"finish"` // stop, length, segment, shed, cancelled
	Resumable        bool    `json:"resumable"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	GeneratedTotal   int     `json:"generated_total"` // over all segments
	ShedTokens       int     `json:"shed_tokens"`
	DeadlineMet      *bool   `json:"deadline_met,omitempty"`
	Utility          float64 `json:"utility"`
	Lane             int     `json:"lane"`
	Uncertainty      float64 `json:"uncertainty"` // predicted output tokens
	FirstTokenMs     float64 `json:"first_token_ms"`
	TotalMs          float64 `json:"total_ms"`
}

const (
	maxIDBytes      = 128
	maxRequestBytes = 1 << 20
)

// Generate runs one request and blocks until it ends, streaming its text
// to cb (which may be null). Call it from a background thread, e.g. a
// Kotlin coroutine on Dispatchers.Default, never the UI thread: the work
// runs on the engine's lanes, and the calling thread waits and runs the
// callbacks. requestJSON is a JSON object like the server's completion
// request:
//
//	prompt          the text to continue (required)
//	id              names the request for Cancel and Resume (default:
//	                one is assigned; it is in the result)
//	max_tokens      tokens to generate at most (default: the engine's)
//	min_tokens      under overload the request may end early, never
//	                before these (default: max_tokens, all mandatory;
//	                0 counts as 1)
//	temperature     0..2 (default 1; 0 is greedy), top_p, top_k, min_p,
//	repeat_penalty  sampling, as the server takes them
//	seed            makes sampling reproducible (default: random)
//	deadline_ms     the soft deadline, which the scheduler keeps
//	priority        a strict class, -10..10
//	segment         "line", "statement" or {"regex": "..."}: the request
//	                ends at each segment with finish "segment" and is
//	                parked until Resume(id, ...)
//	stop            strings that end the generation
//
// It returns the result as JSON: id, text, finish (stop, length, segment,
// shed or cancelled), resumable, token counts, deadline_met, lane,
// uncertainty and timings. A request cancelled by Cancel or Close returns
// normally with finish "cancelled"; bad requests and engine failures are
// errors.
func (e *Engine) Generate(requestJSON string, cb TokenCallback) (string, error) {
	var r request
	if err := decodeJSON(requestJSON, &r, "request"); err != nil {
		return "", err
	}
	req, err := e.schedRequest(&r)
	if err != nil {
		return "", fmt.Errorf("mobile: request: %w", err)
	}
	auto := req.ID == ""
	var (
		ctx  context.Context
		done func()
		st   *sched.Stream
	)
	for {
		if ctx, done, err = e.begin(&req.ID); err != nil {
			return "", err
		}
		st, err = e.sc.Submit(ctx, req)
		if !auto || !errors.Is(err, sched.ErrIDInUse) {
			break
		}
		// The app named a parked request like an assigned id: take the
		// next one.
		done()
		req.ID = ""
	}
	defer done()
	if err != nil {
		return e.refused(ctx, req.ID, "generate", err)
	}
	return e.deliver(ctx, st, cb)
}

// refused reports a Submit or Resume error, or finish "cancelled" when
// Cancel or Close ended the call first (Close makes the scheduler refuse
// new work).
func (e *Engine) refused(ctx context.Context, id, verb string, err error) (string, error) {
	if ctx.Err() != nil {
		return e.encode(result{ID: id, Finish: sched.ReasonCancelled.String()})
	}
	return "", fmt.Errorf("mobile: %s %s: %w", verb, id, err)
}

// Resume continues a request parked at the end of a segment, streaming
// its next segment to cb; it blocks like Generate and returns the same
// result JSON. optionsJSON ("" for none) may set deadline_ms (the next
// segment's deadline, from now) and max_tokens (more tokens allowed from
// now on).
func (e *Engine) Resume(id string, optionsJSON string, cb TokenCallback) (string, error) {
	var r sched.ResumeParams
	if err := decodeJSON(optionsJSON, &r, "resume options"); err != nil {
		return "", err
	}
	opt, err := r.Options()
	if err != nil {
		return "", fmt.Errorf("mobile: resume %s: %w", id, err)
	}
	if id == "" {
		return "", errors.New("mobile: resume: empty id; pass the id from the result of the Generate that ended with finish \"segment\"")
	}
	ctx, done, err := e.begin(&id)
	if err != nil {
		return "", err
	}
	defer done()
	st, err := e.sc.Resume(ctx, id, opt)
	if err != nil {
		return e.refused(ctx, id, "resume", err)
	}
	return e.deliver(ctx, st, cb)
}

// Cancel ends the request id: a running Generate or Resume returns with
// finish "cancelled" after the current step, and a parked request is
// dropped. It reports whether it found the request (false when it has
// already finished or never existed); it never blocks on generation, so
// a UI thread may call it.
func (e *Engine) Cancel(id string) bool {
	e.mu.Lock()
	cancel, ok := e.inflight[id]
	e.mu.Unlock()
	if ok {
		cancel()
		return true
	}
	return e.sc.Discard(id) == nil
}

// begin registers a call for request *id (assigning an id when empty) and
// returns its context, which Cancel and Close end, and the function that
// unregisters it.
func (e *Engine) begin(id *string) (context.Context, func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, nil, fmt.Errorf("mobile: engine is closed: %w", sched.ErrClosed)
	}
	if *id == "" {
		for {
			e.nextID++
			*id = fmt.Sprintf("req-%d", e.nextID)
			if _, busy := e.inflight[*id]; !busy {
				break
			}
		}
	} else if _, busy := e.inflight[*id]; busy {
		return nil, nil, fmt.Errorf("mobile: request id %q is already generating; give each request its own id", *id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	key := *id
	e.inflight[key] = cancel
	return ctx, func() {
		cancel()
		e.mu.Lock()
		delete(e.inflight, key)
		e.mu.Unlock()
	}, nil
}

// deliver forwards a stream's text to cb and returns the result JSON.
// ctx is the call's: when Cancel or Close ended it as the segment was
// released (from OnSegment, or racing with it), the parked request is
// dropped and the call reports finish "cancelled".
func (e *Engine) deliver(ctx context.Context, st *sched.Stream, cb TokenCallback) (string, error) {
	var text strings.Builder
	for {
		ev, err := st.Recv(context.Background())
		if err == io.EOF {
			return "", fmt.Errorf("mobile: %s: the stream ended without a result", st.ID())
		}
		if err != nil {
			return "", fmt.Errorf("mobile: %s: %w", st.ID(), err)
		}
		if ev.Text != "" {
			text.WriteString(ev.Text)
			if cb != nil {
				cb.OnToken(ev.Text)
			}
		}
		if !ev.Done {
			continue
		}
		res := ev.Result
		if res.Reason == sched.ReasonError {
			return "", fmt.Errorf("mobile: %s: %w", res.ID, res.Err)
		}
		if res.Reason == sched.ReasonSegment && cb != nil {
			cb.OnSegment(text.String())
		}
		reason, resumable := res.Reason, res.Resumable
		if resumable && ctx.Err() != nil {
			e.sc.Discard(res.ID)
			reason, resumable = sched.ReasonCancelled, false
		}
		out := result{ID: res.ID, Text: text.String(), Finish: reason.String(), Resumable: resumable,
			PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens, GeneratedTotal: res.TotalGenerated,
			ShedTokens: res.ShedTokens, Utility: res.Utility, Lane: res.Lane, Uncertainty: res.Score,
			TotalMs: ms(res.Finish.Sub(res.Arrival))}
		if !res.FirstToken.IsZero() {
			out.FirstTokenMs = ms(res.FirstToken.Sub(res.Arrival))
		}
		if res.HasDeadline {
			met := res.DeadlineMet
			out.DeadlineMet = &met
		}
		return e.encode(out)
	}
}

func (e *Engine) encode(out result) (string, error) {
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("mobile: %s: encoding the result: %w", out.ID, err)
	}
	return string(b), nil
}

// schedRequest checks r and makes the scheduler's request (the prompt
// as sched.Request.SetTextPrompt fills it). The stop strings are checked
// by Submit.
func (e *Engine) schedRequest(r *request) (sched.Request, error) {
	var req sched.Request
	if r.Prompt == nil {
		return req, errors.New(`prompt is required: {"prompt": "Once upon a time"}`)
	}
	if len(r.ID) > maxIDBytes {
		return req, fmt.Errorf("id has %d bytes, at most %d", len(r.ID), maxIDBytes)
	}
	req.ID = r.ID
	req.Sampling.Seed = rand.Uint64() // unless the request gives one
	if err := r.Params.Apply(&req, e.maxTokens); err != nil {
		return req, err
	}
	req.StopText = r.Stop
	if err := req.SetTextPrompt(e.tok, *r.Prompt); err != nil {
		return req, err
	}
	return req, nil
}

// decodeJSON reads s (a JSON object; "" is {}) into v strictly: unknown
// fields, wrong types and trailing data are errors naming what is wrong.
func decodeJSON(s string, v any, what string) error {
	if len(s) > maxRequestBytes {
		return fmt.Errorf("mobile: %s: %d bytes, at most %d", what, len(s), maxRequestBytes)
	}
	if strings.TrimSpace(s) == "" {
		s = "{}"
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("mobile: %s: %v", what, jsonerr.Explain(err, []byte(s), reflect.TypeOf(v)))
	}
	if dec.More() {
		return fmt.Errorf("mobile: %s: unexpected data after the JSON object", what)
	}
	if e := jsonerr.Strict([]byte(s), reflect.TypeOf(v)); e != nil {
		return fmt.Errorf("mobile: %s: %v", what, e)
	}
	return nil
}
