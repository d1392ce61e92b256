package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
)

// apiError is an error in OpenAI's shape:
// {"error":{"message","type","param","code"}}.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// RetryAfter sets the Retry-After header (429).
	RetryAfter time.Duration `json:"-"`
}

func (e *apiError) Error() string { return e.Message }

func ptr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// badRequest is a 400 naming the offending field.
func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Message: fmt.Sprintf(format, args...), Param: ptr(param)}
}

// fieldError turns the scheduler's check of a request field
// (sched.Params) into a 400 naming the field.
func fieldError(err error) *apiError {
	var fe *sched.FieldError
	if errors.As(err, &fe) {
		return badRequest(fe.Field, "%s", fe.Msg)
	}
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: err.Error()}
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.RetryAfter.Seconds()))))
	}
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// fromSched maps the scheduler's sentinel errors to HTTP.
func (s *Server) fromSched(err error, promptParam string) *apiError {
	switch {
	case errors.Is(err, sched.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: ptr("queue_full"),
			Message: "the request queue is full; retry after the time in Retry-After", RetryAfter: s.retryAfter()}
	case errors.Is(err, sched.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: ptr("shutting_down"),
			Message: "the server is shutting down"}
	case errors.Is(err, sched.ErrContextFull):
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: ptr("context_length_exceeded"),
			Param: ptr(promptParam), Message: err.Error()}
	case errors.Is(err, sched.ErrNotParked):
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: ptr("not_found"),
			Message: err.Error() + " (it finished, expired or never existed)"}
	case errors.Is(err, sched.ErrBusy):
		return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: ptr("busy"),
			Message: err.Error() + "; resume it after its current segment ends"}
	case errors.Is(err, sched.ErrInvalid):
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: err.Error()}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
}

func notLoaded() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: ptr("model_not_loaded"),
		Message: "the model is not loaded yet; retry shortly (GET /healthz reports when it is)", RetryAfter: time.Second}
}
