package sched

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/internal/jsonerr"
)

// Params are the per-request settings every front end takes, as their
// JSON arrives (the HTTP server's completion requests, the mobile
// facade's Generate): nil fields keep the defaults. Front ends embed it in
// their request types, so the names and the checks are the same in both.
type Params struct {
	MaxTokens     *int            `json:"max_tokens"`
	MinTokens     *int            `json:"min_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	MinP          *float64        `json:"min_p"`
	RepeatPenalty *float64        `json:"repeat_penalty"`
	Seed          *int64          `json:"seed"`
	DeadlineMs    *float64        `json:"deadline_ms"`
	Priority      *int            `json:"priority"`
	Segment       json.RawMessage `json:"segment"`
}

// ResumeParams are the settings of a resumed request.
type ResumeParams struct {
	DeadlineMs *float64 `json:"deadline_ms"`
	MaxTokens  *int     `json:"max_tokens"`
}

// DefaultTemperature is OpenAI's default; 0 is greedy decoding.
const DefaultTemperature = 1.0

// MinRepeatPenalty is the least repeat penalty a request may set: it
// multiplies a repeated token's positive logit by at most 100, which no
// model's logits overflow.
const MinRepeatPenalty = 0.01

// FieldError says which field of a request's JSON is wrong and why. It
// matches ErrInvalid.
type FieldError struct {
	Field string // the JSON name, e.g. "top_p" or "segment.regex"
	Msg   string
}

func (e *FieldError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Apply checks p and sets req's token limits, sampling, deadline,
// priority and segment: defaultMaxTokens without max_tokens, the
// temperature DefaultTemperature without one, and a given seed replaces
// req.Sampling.Seed (the caller's random one). An error is a *FieldError.
func (p *Params) Apply(req *Request, defaultMaxTokens int) error {
	req.MaxTokens = defaultMaxTokens
	if p.MaxTokens != nil {
		if *p.MaxTokens < 1 {
			return fieldErr("max_tokens", "max_tokens=%d: must be at least 1", *p.MaxTokens)
		}
		req.MaxTokens = *p.MaxTokens
	}
	if p.MinTokens != nil {
		if *p.MinTokens < 0 || *p.MinTokens > req.MaxTokens {
			return fieldErr("min_tokens", "min_tokens=%d: must be between 0 and max_tokens (%d)", *p.MinTokens, req.MaxTokens)
		}
		// Every answer has a token: 0 would mean "all mandatory" to Request.
		req.MinTokens = max(*p.MinTokens, 1)
	}
	temp := DefaultTemperature
	if p.Temperature != nil {
		temp = *p.Temperature
		if !(temp >= 0 && temp <= 2) {
			return fieldErr("temperature", "temperature=%s: must be between 0 and 2", decimal(float64(temp)))
		}
	}
	req.Sampling.Temperature = float32(temp)
	if p.TopP != nil {
		if !(*p.TopP > 0 && *p.TopP <= 1) {
			return fieldErr("top_p", "top_p=%s: must be in (0, 1]", decimal(*p.TopP))
		}
		// A mass below float32's least keeps the top token, as any tiny
		// mass does: rounded to 0 it would read as top-p off.
		req.Sampling.TopP = max(float32(*p.TopP), math.SmallestNonzeroFloat32)
	}
	if p.TopK != nil {
		if *p.TopK < 0 {
			return fieldErr("top_k", "top_k=%d: must be >= 0 (0 is off)", *p.TopK)
		}
		req.Sampling.TopK = *p.TopK
	}
	if p.MinP != nil {
		if !(*p.MinP >= 0 && *p.MinP < 1) {
			return fieldErr("min_p", "min_p=%s: must be in [0, 1)", decimal(*p.MinP))
		}
		req.Sampling.MinP = float32(*p.MinP)
	}
	if p.RepeatPenalty != nil {
		// Below MinRepeatPenalty, a repeated token's logit divided by it
		// overflows float32 to +Inf on real logits, and the repeated
		// tokens would tie instead of keeping their order.
		if !(*p.RepeatPenalty >= MinRepeatPenalty && *p.RepeatPenalty <= 10) {
			return fieldErr("repeat_penalty", "repeat_penalty=%s: must be between %s and 10 (1 is off; below 1 favours repeats)", decimal(*p.RepeatPenalty), decimal(MinRepeatPenalty))
		}
		req.Sampling.RepeatPenalty = float32(*p.RepeatPenalty)
	}
	if p.Seed != nil {
		req.Sampling.Seed = uint64(*p.Seed)
	}
	if p.DeadlineMs != nil {
		d, err := deadlineMs(*p.DeadlineMs)
		if err != nil {
			return err
		}
		req.Deadline = d
	}
	if p.Priority != nil {
		if *p.Priority < -MaxPriority || *p.Priority > MaxPriority {
			return fieldErr("priority", "priority=%d: must be between -%d and %d", *p.Priority, MaxPriority, MaxPriority)
		}
		req.Priority = *p.Priority
	}
	if len(p.Segment) > 0 && string(p.Segment) != "null" { // null: none, as for other fields
		seg, err := parseSegment(p.Segment)
		if err != nil {
			return err
		}
		req.Segment = seg
	}
	return nil
}

// Options checks p and turns it into ResumeOptions. An error is a
// *FieldError.
func (p *ResumeParams) Options() (ResumeOptions, error) {
	var opt ResumeOptions
	if p.DeadlineMs != nil {
		d, err := deadlineMs(*p.DeadlineMs)
		if err != nil {
			return opt, err
		}
		opt.Deadline = d
	}
	if p.MaxTokens != nil {
		if *p.MaxTokens < 1 {
			return opt, fieldErr("max_tokens", "max_tokens=%d: must be at least 1", *p.MaxTokens)
		}
		opt.MaxTokens = *p.MaxTokens
	}
	return opt, nil
}

func deadlineMs(ms float64) (time.Duration, error) {
	if limit := float64(MaxDeadline / time.Millisecond); !(ms > 0 && ms <= limit) {
		return 0, fieldErr("deadline_ms", "deadline_ms=%s: must be > 0 and at most %.0f (24 hours)", decimal(ms), limit)
	}
	// Up to whole nanoseconds: a tiny deadline must not become 0, none.
	return time.Duration(math.Ceil(ms * float64(time.Millisecond))), nil
}

// decimal writes a number a client sent as it would have written it:
// 86400001, not 8.6400001e+07 (exponents only for the very large or
// small).
func decimal(v float64) string {
	if a := math.Abs(v); a == 0 || a >= 1e-4 && a < 1e21 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// parseSegment reads "line", "statement" or {"regex": "..."}.
func parseSegment(raw json.RawMessage) (*Segmenter, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		seg, err := NewSegmenter(name)
		if err != nil {
			return nil, fieldErr("segment", "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
		return seg, nil
	}
	var obj struct {
		Regex *string `json:"regex"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil || obj.Regex == nil || jsonerr.Strict(raw, reflect.TypeOf(&obj)) != nil {
		return nil, fieldErr("segment", `segment must be "line", "statement" or {"regex": "..."}`)
	}
	seg, err := NewRegexSegmenter(*obj.Regex)
	if err != nil {
		return nil, fieldErr("segment.regex", "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
	}
	return seg, nil
}
