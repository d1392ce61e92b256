package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// job is one request on its way to the scheduler.
type job struct {
	chat         bool
	req          sched.Request
	explicitMax  bool
	promptParam  string
	stream       bool
	includeUsage bool
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	s.generate(w, r, &req, &req.commonRequest, false, func() (string, []int32, *apiError) {
		switch {
		case req.Echo:
			return "", nil, badRequest("echo", "echo is not supported")
		case req.Suffix != nil && *req.Suffix != "":
			return "", nil, badRequest("suffix", "suffix (insertion) is not supported")
		case req.BestOf != nil && *req.BestOf != 1:
			return "", nil, badRequest("best_of", "best_of=%d: tandem returns one choice; send 1 or leave it out", *req.BestOf)
		}
		return parsePrompt(req.Prompt)
	})
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	s.generate(w, r, &req, &req.commonRequest, true, func() (string, []int32, *apiError) {
		text, aerr := renderChat(req.Messages)
		return text, nil, aerr
	})
}

// generate serves both endpoints: decode the body into body (whose shared
// fields are c), validate, build the prompt with prompt, and submit.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, body any, c *commonRequest, chat bool,
	prompt func() (string, []int32, *apiError)) {
	b, aerr := s.backend()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.decode(w, r, body, false); aerr != nil {
		writeError(w, aerr)
		return
	}
	j := &job{chat: chat, promptParam: "prompt"}
	if chat {
		j.promptParam = "messages"
	}
	if aerr := s.common(c, &j.req); aerr != nil {
		writeError(w, aerr)
		return
	}
	text, ids, aerr := prompt()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.tokens(b.tok, text, ids, &j.req, j.promptParam); aerr != nil {
		writeError(w, aerr)
		return
	}
	j.explicitMax = c.MaxTokens != nil || c.MaxCompletionTokens != nil
	j.stream = c.Stream
	j.includeUsage = c.StreamOptions != nil && c.StreamOptions.IncludeUsage
	j.req.ID = newID(completionPrefix)
	if chat {
		j.req.StopText = append(j.req.StopText, chatStop)
		j.req.ID = newID(chatPrefix)
	}
	s.submit(w, r, b, j)
}

// tokens fills the request's prompt ids, text (for the uncertainty
// features), stop tokens and text decoder.
func (s *Server) tokens(tok *tokenizer.Tokenizer, text string, ids []int32, req *sched.Request, param string) *apiError {
	if ids == nil {
		var err error
		ids, err = tok.Encode(text, tokenizer.EncodeOptions{AddBOS: true})
		if err != nil {
			return badRequest(param, "cannot tokenize the prompt: %v", err)
		}
	} else {
		for i, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				return badRequest(param, "token %d at position %d is outside the vocabulary of %d", id, i, tok.VocabSize())
			}
		}
		text, _ = tok.Decode(ids)
	}
	req.Prompt, req.Text = ids, text
	for _, id := range []int32{tok.EOS(), tok.BOS()} {
		// llama2.c models end a story with BOS.
		if id >= 0 {
			req.StopTokens = append(req.StopTokens, id)
		}
	}
	dec := tok.NewDecoder()
	for _, id := range ids {
		dec.Next(id) // prime it, so the first piece keeps its leading space right
	}
	req.Decoder = dec
	return nil
}

// submit checks the request against the context, queues it and answers.
func (s *Server) submit(w http.ResponseWriter, r *http.Request, b *backend, j *job) {
	ctxLen := b.sc.Context()
	n := len(j.req.Prompt)
	if n >= ctxLen {
		writeError(w, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: ptr("context_length_exceeded"),
			Param: ptr(j.promptParam), Message: fmt.Sprintf("the prompt has %d tokens; the context is %d, and generating needs room for at least one more", n, ctxLen)})
		return
	}
	if room := ctxLen - n; j.req.MaxTokens > room {
		if j.explicitMax {
			writeError(w, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: ptr("context_length_exceeded"),
				Param: ptr("max_tokens"), Message: fmt.Sprintf("max_tokens=%d, but the context of %d leaves %d tokens after the %d-token prompt", j.req.MaxTokens, ctxLen, room, n)})
			return
		}
		j.req.MaxTokens = room
		j.req.MinTokens = min(j.req.MinTokens, room)
	}
	st, err := b.sc.Submit(r.Context(), j.req)
	if err != nil {
		writeError(w, s.fromSched(err, j.promptParam))
		return
	}
	s.respond(w, r, st, j.chat, j.stream, j.includeUsage)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	b, aerr := s.backend()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var req resumeRequest // the body is optional
	if aerr := s.decode(w, r, &req, true); aerr != nil {
		writeError(w, aerr)
		return
	}
	opt, err := req.Options()
	if err != nil {
		writeError(w, fieldError(err))
		return
	}
	if req.StreamOptions != nil && !req.Stream {
		writeError(w, badRequest("stream_options", "stream_options is only allowed with stream: true"))
		return
	}
	id := r.PathValue("id")
	st, err := b.sc.Resume(r.Context(), id, opt)
	if err != nil {
		writeError(w, s.fromSched(err, "id"))
		return
	}
	s.respond(w, r, st, isChatID(id), req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
}

func (s *Server) discard(w http.ResponseWriter, r *http.Request) {
	b, aerr := s.backend()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	id := r.PathValue("id")
	if err := b.sc.Discard(id); err != nil {
		writeError(w, s.fromSched(err, "id"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "resume", "deleted": true})
}

// ---- responses ----

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// tandemInfo is the "tandem" object every response carries: what the
// scheduler did with the request.
type tandemInfo struct {
	ID          string  `json:"id"`     // for POST /v1/resume/{id}
	Finish      string  `json:"finish"` // stop, length, segment, shed
	Resumable   bool    `json:"resumable"`
	ShedTokens  int     `json:"shed_tokens"`
	DeadlineMet *bool   `json:"deadline_met,omitempty"`
	Utility     float64 `json:"utility"`
	Lane        int     `json:"lane"`
	Uncertainty float64 `json:"uncertainty"` // predicted output tokens
	QueueMs     float64 `json:"queue_ms"`    // arrival to first token
	TotalMs     float64 `json:"total_ms"`
	Generated   int     `json:"generated_total"` // over all segments
}

func info(res *sched.Result) *tandemInfo {
	ti := &tandemInfo{ID: res.ID, Finish: res.Reason.String(), Resumable: res.Resumable, ShedTokens: res.ShedTokens,
		Utility: res.Utility, Lane: res.Lane, Uncertainty: res.Score, Generated: res.TotalGenerated,
		TotalMs: ms(res.Finish.Sub(res.Arrival))}
	if !res.FirstToken.IsZero() {
		ti.QueueMs = ms(res.FirstToken.Sub(res.Arrival))
	}
	if res.HasDeadline {
		met := res.DeadlineMet
		ti.DeadlineMet = &met
	}
	return ti
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// finishReason maps the scheduler's reason to OpenAI's values: a segment
// end is "stop" (tandem.resumable says more follows), shedding "length"
// (tandem.shed_tokens says how much).
func finishReason(r sched.Reason) string {
	switch r {
	case sched.ReasonLength, sched.ReasonShed:
		return "length"
	}
	return "stop"
}

type textChoice struct {
	Text         string  `json:"text"`
	Index        int     `json:"index"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatChoice struct {
	Index        int      `json:"index"`
	Message      *chatOut `json:"message,omitempty"`
	Delta        *chatOut `json:"delta,omitempty"`
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
}

type chatOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type response struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices any         `json:"choices"`
	Usage   *usage      `json:"usage,omitempty"`
	Tandem  *tandemInfo `json:"tandem,omitempty"`
}

// envelope is a response's or a chunk's frame; created is the same for
// every chunk of a stream, as OpenAI's.
func (s *Server) envelope(id string, chat, chunk bool, created int64) response {
	obj := "text_completion"
	if chat {
		obj = "chat.completion"
		if chunk {
			obj = "chat.completion.chunk"
		}
	}
	return response{ID: id, Object: obj, Created: created, Model: s.cfg.Model}
}

// failure turns an unsuccessful result into the error to send.
func failure(res *sched.Result) *apiError {
	switch res.Reason {
	case sched.ReasonCancelled:
		if errors.Is(res.Err, sched.ErrClosed) {
			return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: ptr("shutting_down"),
				Message: "the server shut down before the request finished"}
		}
		return &apiError{Status: 499, Type: "invalid_request_error", Code: ptr("cancelled"), Message: "the request was cancelled"}
	case sched.ReasonError:
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: fmt.Sprintf("generation failed: %v", res.Err)}
	}
	return nil
}

func (s *Server) respond(w http.ResponseWriter, r *http.Request, st *sched.Stream, chat, stream, includeUsage bool) {
	if stream {
		s.streamSSE(w, r, st, chat, includeUsage)
		return
	}
	var text strings.Builder
	var res *sched.Result
	for res == nil {
		ev, err := st.Recv(r.Context())
		if err != nil {
			return // the client left; the scheduler cancels through the request context
		}
		text.WriteString(ev.Text)
		res = ev.Result
	}
	if aerr := failure(res); aerr != nil {
		writeError(w, aerr)
		return
	}
	reason := finishReason(res.Reason)
	out := s.envelope(res.ID, chat, false, time.Now().Unix())
	out.Usage = &usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens, TotalTokens: res.PromptTokens + res.CompletionTokens}
	out.Tandem = info(res)
	if chat {
		content := text.String()
		out.Choices = []chatChoice{{Message: &chatOut{Role: "assistant", Content: &content}, FinishReason: &reason}}
	} else {
		out.Choices = []textChoice{{Text: text.String(), FinishReason: &reason}}
	}
	writeJSON(w, http.StatusOK, out)
}

// streamSSE sends server-sent events: one chunk per delivered piece of
// text, a last chunk with the finish reason, a usage chunk when asked,
// then "data: [DONE]".
func (s *Server) streamSSE(w http.ResponseWriter, r *http.Request, st *sched.Stream, chat, includeUsage bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Every return before [DONE] is a client that left.
	complete := false
	defer func() {
		if !complete {
			clientLeft(w)
		}
	}()
	rc := http.NewResponseController(w)
	send := func(v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return err
		}
		return rc.Flush()
	}
	id, created := st.ID(), time.Now().Unix()
	if chat {
		c := s.envelope(id, true, true, created)
		empty := ""
		c.Choices = []chatChoice{{Delta: &chatOut{Role: "assistant", Content: &empty}}}
		if send(c) != nil {
			return
		}
	}
	for {
		ev, err := st.Recv(r.Context())
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return // the client left
			}
			break
		}
		if ev.Text != "" {
			c := s.envelope(id, chat, true, created)
			if chat {
				text := ev.Text
				c.Choices = []chatChoice{{Delta: &chatOut{Content: &text}}}
			} else {
				c.Choices = []textChoice{{Text: ev.Text}}
			}
			if send(c) != nil {
				return
			}
		}
		if !ev.Done {
			continue
		}
		res := ev.Result
		if aerr := failure(res); aerr != nil {
			if aerr.Status == 499 {
				return // the client left (its context cancelled the request)
			}
			send(map[string]*apiError{"error": aerr})
			break
		}
		reason := finishReason(res.Reason)
		c := s.envelope(id, chat, true, created)
		c.Tandem = info(res)
		if chat {
			c.Choices = []chatChoice{{Delta: &chatOut{}, FinishReason: &reason}}
		} else {
			c.Choices = []textChoice{{FinishReason: &reason}}
		}
		if send(c) != nil {
			return
		}
		if includeUsage {
			u := s.envelope(id, chat, true, created)
			u.Choices = []struct{}{}
			u.Usage = &usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens, TotalTokens: res.PromptTokens + res.CompletionTokens}
			if send(u) != nil {
				return
			}
		}
		break
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	rc.Flush()
	complete = true
}
