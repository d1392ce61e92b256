package sched

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/tandem-llm/tandem/runtime/sample"
)

// Request is one client's generation.
type Request struct {
	// ID names the request (for Resume and logs); Submit assigns one
	// when empty. It must be unique among live requests.
	ID string
	// Prompt is the token ids to continue (BOS first for llama models).
	// The scheduler reads it until the request ends: do not change it
	// meanwhile.
	Prompt []int32
	// Text is the prompt as text, which the uncertainty features read
	// (empty: the estimate falls back to the prompt length).
	Text string

	// MaxTokens bounds the generated tokens over all segments (0:
	// Config.DefaultMaxTokens, at most the engine's context).
	MaxTokens int
	// MinTokens is the mandatory part: under overload the scheduler may
	// end the request early, but never before MinTokens (imprecise
	// computation). 0 means the whole MaxTokens is mandatory.
	MinTokens int
	// Sampling picks tokens (zero value: greedy).
	Sampling sample.Options
	// StopTokens end the generation (EOS; BOS for llama2.c models). The
	// stop token is not delivered.
	StopTokens []int32
	// StopText ends the generation where the decoded text contains one of
	// these strings, which are not delivered (OpenAI's "stop").
	StopText []string

	// Deadline is the soft deadline, relative to Submit (0: none).
	Deadline time.Duration
	// Utility is what finishing is worth (TimelyLLM's time-utility
	// function); the zero value is Value 1, falling to 0 one Deadline
	// after the deadline.
	Utility Utility
	// Priority is a strict class: a higher class is always served before
	// a lower one; within a class the policy orders. Range -10..10.
	Priority int

	// Segment, when set, releases the output segment by segment: when a
	// segment completes the stream ends with Reason Segment and the
	// sequence is parked until Resume.
	Segment *Segmenter

	// Text decoding: the scheduler needs it for StopText and Segment and
	// to fill Event.Text. Nil delivers token ids only.
	Decoder Decoder
}

// Decoder turns token ids into text incrementally
// (tokenizer.Decoder satisfies it).
type Decoder interface {
	Next(id int32) string
	Flush() string
}

// Utility is a time-utility function: Value until the deadline, then
// falling by Slope per second to 0. While a late request's utility lasts,
// tandem still serves it before requests with nothing at stake: a gentle
// Slope asks for a late answer soon rather than behind the backlog.
type Utility struct {
	Value float64 // β (default 1)
	Slope float64 // α, per second (default Value / relative deadline)
}

// At is the utility of finishing late after the deadline (late <= 0: on
// time) for a request whose relative deadline is rel.
func (u Utility) At(late, rel time.Duration) float64 {
	v, s := u.resolved(rel)
	if late <= 0 {
		return v
	}
	return max(0, v-s*late.Seconds())
}

// window is how long after the deadline finishing still earns utility.
func (u Utility) window(rel time.Duration) time.Duration {
	v, s := u.resolved(rel)
	if s <= 0 {
		return MaxDeadline
	}
	return time.Duration(min(v/s, MaxDeadline.Seconds()) * float64(time.Second))
}

func (u Utility) resolved(rel time.Duration) (value, slope float64) {
	value, slope = u.Value, u.Slope
	if value == 0 {
		value = 1
	}
	if slope == 0 && rel > 0 {
		slope = value / rel.Seconds()
	}
	return value, slope
}

// Limits on request fields, so that absurd values get a clear error.
const (
	MaxDeadline   = 24 * time.Hour
	MaxPriority   = 10
	maxStopTexts  = 16
	maxStopLength = 256
)

// MinContext is the smallest context per sequence that serve and the
// mobile bindings accept: below it no useful prompt and answer fit, and
// every request would fail.
const MinContext = 16

// Validate checks the fields a caller sets; errors wrap ErrInvalid and
// name the field.
func (r *Request) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
	}
	switch {
	case len(r.Prompt) == 0:
		return bad("prompt", "empty; a llama prompt starts with BOS")
	case r.MaxTokens < 0:
		return bad("max_tokens", "%d is negative", r.MaxTokens)
	case r.MinTokens < 0:
		return bad("min_tokens", "%d is negative", r.MinTokens)
	case r.MaxTokens > 0 && r.MinTokens > r.MaxTokens:
		return bad("min_tokens", "%d exceeds max_tokens %d", r.MinTokens, r.MaxTokens)
	case r.Deadline < 0:
		return bad("deadline", "%v is negative", r.Deadline)
	case r.Deadline > MaxDeadline:
		return bad("deadline", "%v is over the %v limit", r.Deadline, MaxDeadline)
	case r.Priority < -MaxPriority || r.Priority > MaxPriority:
		return bad("priority", "%d is outside -%d..%d", r.Priority, MaxPriority, MaxPriority)
	case !finite(r.Utility.Value) || r.Utility.Value < 0:
		return bad("utility.value", "%v: want a finite value >= 0", r.Utility.Value)
	case !finite(r.Utility.Slope) || r.Utility.Slope < 0:
		return bad("utility.slope", "%v: want a finite value >= 0", r.Utility.Slope)
	case len(r.StopText) > maxStopTexts:
		return bad("stop", "%d strings, at most %d", len(r.StopText), maxStopTexts)
	}
	for i, s := range r.StopText {
		if s == "" || len(s) > maxStopLength {
			return bad("stop", "string %d has %d bytes; want 1..%d", i, len(s), maxStopLength)
		}
	}
	if (len(r.StopText) > 0 || r.Segment != nil) && r.Decoder == nil {
		return bad("decoder", "stop strings and segments need a text decoder")
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// Segmenter finds where a segment of generated text ends.
type Segmenter struct {
	kind SegmentKind
	re   *regexp.Regexp
}

// SegmentKind names a built-in delimiter.
type SegmentKind int

const (
	SegmentLine      SegmentKind = iota + 1 // one non-empty line, up to and including its newline
	SegmentStatement                        // one sentence or statement: up to . ! ? or ; (and the quotes or brackets closing after it) followed by a space or newline
	SegmentRegex                            // up to the end of the first match of a regular expression
)

// NewSegmenter makes a built-in delimiter: "line" or "statement".
func NewSegmenter(name string) (*Segmenter, error) {
	switch name {
	case "line":
		return &Segmenter{kind: SegmentLine}, nil
	case "statement":
		return &Segmenter{kind: SegmentStatement}, nil
	}
	return nil, fmt.Errorf("%w: segment: %q is not a built-in delimiter; use \"line\", \"statement\" or a regex", ErrInvalid, name)
}

// NewRegexSegmenter ends a segment at the end of the first match of expr
// (RE2 syntax). An expression that can match the empty string is refused.
func NewRegexSegmenter(expr string) (*Segmenter, error) {
	if len(expr) > 1024 {
		return nil, fmt.Errorf("%w: segment regex is %d bytes, at most 1024", ErrInvalid, len(expr))
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: segment regex: %v", ErrInvalid, err)
	}
	// Probe for empty matches: a zero-width match (^, \b, a*) would end a
	// segment before it began.
	for _, probe := range []string{"", "a", " ", "ab cd", "\n", "x.y", "1", "A!"} {
		if loc := re.FindStringIndex(probe); loc != nil && loc[0] == loc[1] {
			return nil, fmt.Errorf("%w: segment regex %q can match the empty string; it must consume at least one character", ErrInvalid, expr)
		}
	}
	return &Segmenter{kind: SegmentRegex, re: re}, nil
}

// Kind returns the delimiter kind.
func (s *Segmenter) Kind() SegmentKind { return s.kind }

// String describes the delimiter.
func (s *Segmenter) String() string {
	switch s.kind {
	case SegmentLine:
		return "line"
	case SegmentStatement:
		return "statement"
	case SegmentRegex:
		return "regex " + s.re.String()
	}
	return "none"
}

// Cut returns the length of the first complete segment of text, or -1
// when text holds no complete segment yet.
func (s *Segmenter) Cut(text string) int {
	switch s.kind {
	case SegmentLine:
		// A line counts once it has content: leading blank lines belong
		// to the line after them.
		content := false
		for i := 0; i < len(text); i++ {
			switch text[i] {
			case '\n':
				if content {
					return i + 1
				}
			case ' ', '\t', '\r':
			default:
				content = true
			}
		}
	case SegmentStatement:
		for i := 0; i+1 < len(text); i++ {
			switch text[i] {
			case '.', '!', '?', ';':
				// A quotation or an aside ends with the sentence inside
				// it: `"Let's go to the park." Lily` cuts after the quote.
				end := i + 1
				for end < len(text) {
					n := closerLen(text[end:])
					if n == 0 {
						break
					}
					end += n
				}
				if end < len(text) {
					if c := text[end]; c == ' ' || c == '\n' || c == '\t' || c == '\r' {
						return end
					}
				}
			}
		}
	case SegmentRegex:
		if loc := s.re.FindStringIndex(text); loc != nil && loc[1] > 0 {
			return loc[1]
		}
	}
	return -1
}

// closerLen is the length of the closing quote or bracket text starts
// with, 0 if none: " ' ) ] and the typographic ” ’ ».
func closerLen(text string) int {
	switch text[0] {
	case '"', '\'', ')', ']':
		return 1
	}
	for _, c := range []string{"”", "’", "»"} {
		if strings.HasPrefix(text, c) {
			return len(c)
		}
	}
	return 0
}

// Reason says why a stream ended.
type Reason int

const (
	ReasonStop      Reason = iota + 1 // a stop token or stop text
	ReasonLength                      // MaxTokens, or the context is full
	ReasonSegment                     // a segment completed; the request is parked (Resume continues it)
	ReasonShed                        // ended early under overload after its MinTokens (imprecise computation)
	ReasonCancelled                   // the caller's context ended, or shutdown cancelled it
	ReasonError                       // the engine failed (Event.Err says how)
)

var reasonNames = [...]string{ReasonStop: "stop", ReasonLength: "length", ReasonSegment: "segment",
	ReasonShed: "shed", ReasonCancelled: "cancelled", ReasonError: "error"}

func (r Reason) String() string {
	if r > 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Event is what a Stream delivers: generated tokens, then one final event
// with Done set.
type Event struct {
	Tokens []int32   // new tokens (stop tokens excluded)
	Text   string    // their text (with a Decoder; held back while it may start a stop string)
	Time   time.Time // when the scheduler delivered them

	Done   bool
	Result *Result // set on the final event
}

// Result describes a finished stream (one segment for segmented requests).
type Result struct {
	ID     string
	Reason Reason
	Err    error // for ReasonError and ReasonCancelled

	PromptTokens     int
	CompletionTokens int // tokens delivered on this stream
	TotalGenerated   int // over all segments so far
	// ShedTokens is how many optional tokens were not generated because
	// the request was ended early (MaxTokens - generated), on the result
	// that ends it (a parked request may be resumed with a new budget).
	ShedTokens int

	Arrival    time.Time // Submit or Resume
	FirstToken time.Time // zero when no token was delivered
	Finish     time.Time

	HasDeadline bool
	DeadlineMet bool
	Utility     float64 // the time-utility function at Finish (0 when cancelled or failed)
	Lane        int
	Score       float64 // the uncertainty estimate u, in tokens
	Resumable   bool    // parked: Resume continues it
}
