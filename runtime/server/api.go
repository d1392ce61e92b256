package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// commonRequest holds the fields both endpoints share: OpenAI's, then
// tandem's extensions.
type commonRequest struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	User                string          `json:"user"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	LogitBias           map[string]any  `json:"logit_bias"`
	Logprobs            json.RawMessage `json:"logprobs"`

	// llama.cpp-style sampling extensions.
	TopK          *int     `json:"top_k"`
	MinP          *float64 `json:"min_p"`
	RepeatPenalty *float64 `json:"repeat_penalty"`

	// tandem's scheduling extensions.
	DeadlineMs *float64        `json:"deadline_ms"`
	Priority   *int            `json:"priority"`
	Segment    json.RawMessage `json:"segment"`
	MinTokens  *int            `json:"min_tokens"`
	Utility    *utilityField   `json:"utility"`
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
}

type resumeRequest struct {
	DeadlineMs    *float64       `json:"deadline_ms"`
	MaxTokens     *int           `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

// decode reads a JSON body strictly: unknown fields, wrong types, trailing
// data and oversized bodies are 400s (413 for size) naming what is wrong.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) *apiError {
	body := http.MaxBytesReader(w, r.Body, limit)
	data, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body over %d bytes", limit)}
		}
		return badRequest("", "reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("", "empty request body; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, data)
	}
	if dec.More() {
		return badRequest("", "unexpected data after the JSON object")
	}
	return nil
}

// jsonError explains a decoding error: where, which field, what was wanted.
func jsonError(err error, data []byte) *apiError {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return badRequest("", "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		// Fields of the embedded commonRequest are named through it.
		field := strings.TrimPrefix(typ.Field, "commonRequest.")
		if field == "" {
			return badRequest("", "the body must be a JSON object, not %s", typ.Value)
		}
		return badRequest(field, "field %q has the wrong type: got %s, want %s", field, typ.Value, typeName(typ.Type.String()))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "malformed JSON: the body ends early (%d bytes)", len(data))
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return badRequest(f, "unknown field %q; see the API reference in README (Serving)", f)
	}
	return badRequest("", "invalid JSON: %v", err)
}

func typeName(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "bool"):
		return "true or false"
	case strings.Contains(goType, "string"):
		return "a string"
	case strings.HasPrefix(goType, "[]"), strings.HasPrefix(goType, "*[]"):
		return "an array"
	}
	return "an object"
}

// Limits the server enforces beyond the scheduler's.
const (
	maxStops       = 4 // as OpenAI
	maxDeadlineMs  = float64(sched.MaxDeadline / time.Millisecond)
	defaultTemp    = 1.0 // OpenAI's default; send temperature 0 for greedy decoding
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
	if l := bytes.TrimSpace(c.Logprobs); len(l) > 0 && !bytes.Equal(l, []byte("null")) && !bytes.Equal(l, []byte("false")) && !bytes.Equal(l, []byte("0")) {
		return badRequest("logprobs", "logprobs are not supported")
	}
	if c.StreamOptions != nil && !c.Stream {
		return badRequest("stream_options", "stream_options is only allowed with stream: true")
	}

	limit, param := c.MaxTokens, "max_tokens"
	if c.MaxCompletionTokens != nil {
		if c.MaxTokens != nil {
			return badRequest("max_completion_tokens", "send max_tokens or max_completion_tokens, not both")
		}
		limit, param = c.MaxCompletionTokens, "max_completion_tokens"
	}
	if limit != nil {
		if *limit < 1 {
			return badRequest(param, "%s=%d: must be at least 1", param, *limit)
		}
		req.MaxTokens = *limit
	} else {
		req.MaxTokens = s.cfg.DefaultMaxTokens
	}
	if c.MinTokens != nil {
		if *c.MinTokens < 0 || *c.MinTokens > req.MaxTokens {
			return badRequest("min_tokens", "min_tokens=%d: must be between 0 and max_tokens (%d)", *c.MinTokens, req.MaxTokens)
		}
		req.MinTokens = *c.MinTokens
	}

	temp := defaultTemp
	if c.Temperature != nil {
		temp = *c.Temperature
		if !(temp >= 0 && temp <= 2) {
			return badRequest("temperature", "temperature=%v: must be between 0 and 2", temp)
		}
	}
	req.Sampling.Temperature = float32(temp)
	if c.TopP != nil {
		if !(*c.TopP > 0 && *c.TopP <= 1) {
			return badRequest("top_p", "top_p=%v: must be in (0, 1]", *c.TopP)
		}
		req.Sampling.TopP = float32(*c.TopP)
	}
	if c.TopK != nil {
		if *c.TopK < 0 {
			return badRequest("top_k", "top_k=%d: must be >= 0 (0 is off)", *c.TopK)
		}
		req.Sampling.TopK = *c.TopK
	}
	if c.MinP != nil {
		if !(*c.MinP >= 0 && *c.MinP < 1) {
			return badRequest("min_p", "min_p=%v: must be in [0, 1)", *c.MinP)
		}
		req.Sampling.MinP = float32(*c.MinP)
	}
	if c.RepeatPenalty != nil {
		if !(*c.RepeatPenalty > 0 && *c.RepeatPenalty <= 10) {
			return badRequest("repeat_penalty", "repeat_penalty=%v: must be in (0, 10]", *c.RepeatPenalty)
		}
		req.Sampling.RepeatPenalty = float32(*c.RepeatPenalty)
	}
	if c.Seed != nil {
		req.Sampling.Seed = uint64(*c.Seed)
	} else {
		req.Sampling.Seed = s.randomSeed()
	}

	stops, err := parseStop(c.Stop)
	if err != nil {
		return err
	}
	req.StopText = append(req.StopText, stops...)

	if c.DeadlineMs != nil {
		d := *c.DeadlineMs
		if !(d > 0 && d <= maxDeadlineMs) {
			return badRequest("deadline_ms", "deadline_ms=%v: must be > 0 and at most %.0f (24 hours)", d, maxDeadlineMs)
		}
		req.Deadline = time.Duration(d * float64(time.Millisecond))
	}
	if c.Priority != nil {
		if *c.Priority < -sched.MaxPriority || *c.Priority > sched.MaxPriority {
			return badRequest("priority", "priority=%d: must be between -%d and %d", *c.Priority, sched.MaxPriority, sched.MaxPriority)
		}
		req.Priority = *c.Priority
	}
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
	if len(c.Segment) > 0 {
		seg, err := parseSegment(c.Segment)
		if err != nil {
			return err
		}
		req.Segment = seg
	}
	return nil
}

// parseStop reads OpenAI's stop: a string or an array of up to 4.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, badRequest("stop", "stop is an empty string")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
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

// parseSegment reads the segment extension: "line", "statement" or
// {"regex": "..."}.
func parseSegment(raw json.RawMessage) (*sched.Segmenter, *apiError) {
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		seg, err := sched.NewSegmenter(name)
		if err != nil {
			return nil, badRequest("segment", `segment %q: want "line", "statement" or {"regex": "..."}`, name)
		}
		return seg, nil
	}
	var obj struct {
		Regex *string `json:"regex"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil || obj.Regex == nil {
		return nil, badRequest("segment", `segment must be "line", "statement" or {"regex": "..."}`)
	}
	seg, err := sched.NewRegexSegmenter(*obj.Regex)
	if err != nil {
		return nil, badRequest("segment.regex", "%v", strings.TrimPrefix(err.Error(), sched.ErrInvalid.Error()+": "))
	}
	return seg, nil
}

// parsePrompt reads a completion prompt: a string, an array of one string,
// an array of token ids or an array of one such array.
func parsePrompt(raw json.RawMessage) (text string, ids []int32, err *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
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
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
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
