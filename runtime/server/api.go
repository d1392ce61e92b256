package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tandem-llm/tandem/internal/jsonerr"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// commonRequest holds the fields both endpoints share: OpenAI's, then
// tandem's extensions.
type commonRequest struct {
	// max_tokens, temperature, top_p, seed; llama.cpp's top_k, min_p and
	// repeat_penalty; tandem's deadline_ms, priority, segment and
	// min_tokens: checked as the mobile facade checks them.
	sched.Params

	Model               string          `json:"model"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Stop                json.RawMessage `json:"stop"`
	User                string          `json:"user"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	LogitBias           map[string]any  `json:"logit_bias"`
	Utility             *utilityField   `json:"utility"`
	openAIOnly
}

// openAIOnly are OpenAI parameters for features tandem does not have. They
// are declared so that a client that sends one empty (null, false, [],
// {}) is served, and one that asks for the feature is told it is not
// supported rather than that the field is unknown.
type openAIOnly struct {
	Logprobs          json.RawMessage `json:"logprobs"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls json.RawMessage `json:"parallel_tool_calls"`
	Functions         json.RawMessage `json:"functions"`
	FunctionCall      json.RawMessage `json:"function_call"`
	ResponseFormat    json.RawMessage `json:"response_format"`
	TopLogprobs       json.RawMessage `json:"top_logprobs"`
	Store             json.RawMessage `json:"store"`
	Metadata          json.RawMessage `json:"metadata"`
	ReasoningEffort   json.RawMessage `json:"reasoning_effort"`
	Modalities        json.RawMessage `json:"modalities"`
	Audio             json.RawMessage `json:"audio"`
	Prediction        json.RawMessage `json:"prediction"`
	ServiceTier       json.RawMessage `json:"service_tier"`
	WebSearchOptions  json.RawMessage `json:"web_search_options"`
}

// firstAsked returns the JSON name of the first field of the struct *v
// that asks for something (anything but absent, null, false, 0, "", []
// or {}, or a value in asksNothing), or "". Every field of v is a
// json.RawMessage accepted only empty.
func firstAsked(v any) string {
	rv := reflect.ValueOf(v).Elem()
	for i := range rv.NumField() {
		name, _, _ := strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
		switch val := string(bytes.Join(bytes.Fields(rv.Field(i).Bytes()), nil)); val {
		case "", "null", "false", "0", `""`, "[]", "{}":
		default:
			if !slices.Contains(asksNothing[name], val) {
				return name
			}
		}
	}
	return ""
}

// asksNothing are values of OpenAI parameters (without spaces) that ask
// for what tandem does anyway: plain text, no tool, the default service
// tier. Clients that spell out the defaults are served.
var asksNothing = map[string][]string{
	"response_format": {`{"type":"text"}`},
	"tool_choice":     {`"none"`},
	"service_tier":    {`"auto"`, `"default"`},
	"modalities":      {`["text"]`},
	// OpenAI's default; with no tools there are no calls to make at once.
	"parallel_tool_calls": {`true`},
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// Obfuscation pads chunks against size side channels on the
	// internet; on loopback there is nothing to hide, so it is accepted
	// and ignored.
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

type utilityField struct {
	Value *float64 `json:"value"`
	Slope *float64 `json:"slope"`
}

type completionRequest struct {
	commonRequest
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	Suffix *string         `json:"suffix"`
	BestOf *int            `json:"best_of"`
}

type chatRequest struct {
	commonRequest
	Messages []chatMessage `json:"messages"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
	// A refusal's text stands for missing content.
	Refusal *string `json:"refusal"`
	messageExtras
}

// messageExtras are what OpenAI's clients send back in an assistant
// message as they received it, null or empty (the helpers of the Node
// client add parsed): accepted when empty, since tandem never produces
// them.
type messageExtras struct {
	Parsed       json.RawMessage `json:"parsed"`
	Annotations  json.RawMessage `json:"annotations"`
	Audio        json.RawMessage `json:"audio"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
	ToolCallID   json.RawMessage `json:"tool_call_id"`
}

// check refuses what a message asks for beyond text.
func (m *chatMessage) check(i int) *apiError {
	if name := firstAsked(&m.messageExtras); name != "" {
		return badRequest(fmt.Sprintf("messages[%d].%s", i, name), "%s in messages is not supported by tandem (text only); remove it", name)
	}
	return nil
}

type resumeRequest struct {
	sched.ResumeParams
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

// decode reads a JSON body strictly: unknown fields, wrong types, trailing
// data and oversized bodies are 400s (413 for size) naming what is wrong,
// and a body that stalls past Config.BodyTimeout is a 408. An empty body
// is a 400 unless empty is allowed (then v keeps its zero value).
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any, empty bool) *apiError {
	// The deadline covers the body only: once it is read, the connection
	// is watched for the client leaving, however long the answer takes
	// (a server-wide ReadTimeout would cancel long streams). After a failed
	// read it stays, so the connection closes instead of waiting for the
	// rest of the body.
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		// Read as it came, a gzip body would be a UTF-8 error, and a
		// plain one under the header would be taken on trust.
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: fmt.Sprintf("Content-Encoding %q is not supported; send the body uncompressed", ce)}
	}
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) == nil
	limit := s.cfg.MaxBodyBytes
	body := http.MaxBytesReader(w, r.Body, limit)
	data, err := io.ReadAll(body)
	if err == nil && deadline {
		rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body over %d bytes", limit)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
				Message: fmt.Sprintf("the request body did not arrive within %v", s.cfg.BodyTimeout)}
		}
		return badRequest("", "reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		if empty {
			return nil // v keeps its zero value
		}
		return badRequest("", "empty request body; send a JSON object")
	}
	if i := invalidUTF8(data); i >= 0 {
		// encoding/json would turn the bytes into U+FFFD and the model
		// would answer a prompt the client never sent.
		return badRequest("", "the request body is not UTF-8 (a bad byte at offset %d); JSON must be sent as UTF-8", i)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		e := jsonerr.Explain(err, data, reflect.TypeOf(v))
		if e.Unknown {
			e.Msg += "; see the API reference in README (Serving)"
		}
		return badRequest(e.Field, "%s", e.Msg)
	}
	if dec.More() {
		return badRequest("", "unexpected data after the JSON object")
	}
	if e := jsonerr.Strict(data, reflect.TypeOf(v)); e != nil {
		return badRequest(e.Field, "%s", e.Msg)
	}
	return nil
}

// Limits the server enforces beyond the scheduler's.
const (
	maxStops       = 4 // as OpenAI
	maxMessages    = 1024
	maxContentSize = 1 << 20
)

// common validates the shared fields into a scheduler request (prompt and
// tokens are the caller's).
func (s *Server) common(c *commonRequest, req *sched.Request) *apiError {
	if c.N != nil && *c.N != 1 {
		return badRequest("n", "n=%d: tandem returns one choice per request; send n=1 or leave it out", *c.N)
	}
	if c.PresencePenalty != nil && *c.PresencePenalty != 0 {
		return badRequest("presence_penalty", "presence_penalty is not supported; use repeat_penalty")
	}
	if c.FrequencyPenalty != nil && *c.FrequencyPenalty != 0 {
		return badRequest("frequency_penalty", "frequency_penalty is not supported; use repeat_penalty")
	}
	if len(c.LogitBias) > 0 {
		return badRequest("logit_bias", "logit_bias is not supported")
	}
	if name := firstAsked(&c.openAIOnly); name != "" {
		return badRequest(name, "%s is not supported by tandem; remove it", name)
	}
	if c.StreamOptions != nil && !c.Stream {
		return badRequest("stream_options", "stream_options is only allowed with stream: true")
	}

	if c.MaxCompletionTokens != nil {
		if c.MaxTokens != nil {
			return badRequest("max_completion_tokens", "send max_tokens or max_completion_tokens, not both")
		}
		if *c.MaxCompletionTokens < 1 {
			return badRequest("max_completion_tokens", "max_completion_tokens=%d: must be at least 1", *c.MaxCompletionTokens)
		}
		c.MaxTokens = c.MaxCompletionTokens
	}
	req.Sampling.Seed = s.randomSeed() // unless the request gives one
	if err := c.Params.Apply(req, s.cfg.DefaultMaxTokens); err != nil {
		return fieldError(err)
	}
	stops, err := parseStop(c.Stop)
	if err != nil {
		return err
	}
	req.StopText = append(req.StopText, stops...)
	if c.Utility != nil {
		if v := c.Utility.Value; v != nil {
			if !(*v >= 0) || math.IsInf(*v, 0) || *v > 1e6 {
				return badRequest("utility.value", "utility.value=%v: must be between 0 and 1e6", *v)
			}
			req.Utility.Value = *v
		}
		if v := c.Utility.Slope; v != nil {
			if !(*v >= 0) || math.IsInf(*v, 0) || *v > 1e6 {
				return badRequest("utility.slope", "utility.slope=%v: must be between 0 and 1e6 (utility lost per second late)", *v)
			}
			req.Utility.Slope = *v
		}
	}
	return nil
}

// absent reports whether a field was left out or sent as null.
func absent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// parseStop reads OpenAI's stop: a string or an array of up to 4.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if absent(raw) {
		return nil, nil
	}
	var one string
	var many []string
	if err := json.Unmarshal(raw, &one); err == nil {
		many = []string{one} // checked as the array's are
	} else if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(many) > maxStops {
		return nil, badRequest("stop", "%d stop strings, at most %d", len(many), maxStops)
	}
	for i, s := range many {
		if s == "" || len(s) > 256 {
			return nil, badRequest("stop", "stop string %d has %d bytes; want 1..256", i, len(s))
		}
	}
	return many, nil
}

// parsePrompt reads a completion prompt: a string, an array of one string,
// an array of token ids or an array of one such array.
func parsePrompt(raw json.RawMessage) (text string, ids []int32, err *apiError) {
	if absent(raw) {
		return "", nil, badRequest("prompt", "prompt is required")
	}
	if json.Unmarshal(raw, &text) == nil {
		return text, nil, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return "", nil, badRequest("prompt", "%d prompts: tandem takes one prompt per request", len(texts))
		}
		return texts[0], nil, nil
	}
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("prompt", "empty token array")
		}
		return "", ids, nil
	}
	var idss [][]int32
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 || len(idss[0]) == 0 {
			return "", nil, badRequest("prompt", "%d token arrays: tandem takes one non-empty prompt per request", len(idss))
		}
		return "", idss[0], nil
	}
	return "", nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
}

// messageText reads a chat message's content: a string or an array of
// {"type":"text","text":...} parts.
func messageText(i int, raw json.RawMessage) (string, *apiError) {
	param := fmt.Sprintf("messages[%d].content", i)
	if absent(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "content must be a string or an array of text parts")
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return "", badRequest(fmt.Sprintf("%s[%d].type", param, j), "part type %q: tandem takes text parts only", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// invalidUTF8 is the offset of the first byte of data that is not UTF-8,
// or -1.
func invalidUTF8(data []byte) int {
	if utf8.Valid(data) {
		return -1
	}
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}
