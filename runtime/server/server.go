// Package server is tandem's HTTP API: OpenAI-compatible completions and
// chat completions (with streaming), the model list, tandem's scheduling
// extensions (deadline_ms, priority, segment, min_tokens, utility, and
// POST /v1/resume/{id} for segmented requests), Prometheus metrics and a
// health check. It turns HTTP into sched.Requests and streams back what
// the scheduler delivers; it knows nothing about kernels or weights.
package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// Config configures a Server.
type Config struct {
	// Model is the id served in /v1/models and responses. Requests may
	// name any model: the server has one.
	Model string
	// DefaultMaxTokens is max_tokens for requests that do not set it
	// (default 256), within the context.
	DefaultMaxTokens int
	// MaxBodyBytes bounds request bodies (default 4 MiB).
	MaxBodyBytes int64
	// BodyTimeout bounds the time a request's body takes to arrive
	// (default 30 s): a client that stalls mid-body gets a 408.
	BodyTimeout time.Duration
}

// Server serves the API. Make it with New; it answers 503 until Ready
// gives it a scheduler.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	created time.Time

	ready   atomic.Pointer[backend]
	closing atomic.Bool

	mu      sync.Mutex
	byCode  map[int]uint64
	samples []snapshot // for rates in /metrics
}

type backend struct {
	sc  *sched.Scheduler
	tok *tokenizer.Tokenizer
}

// New makes a server that answers 503 until Ready.
func New(cfg Config) *Server {
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 256
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 4 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 30 * time.Second
	}
	if cfg.Model == "" {
		cfg.Model = "tandem"
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), created: time.Now(), byCode: map[int]uint64{}}
	s.handle("/v1/completions", http.MethodPost, s.completions)
	s.handle("/v1/chat/completions", http.MethodPost, s.chat)
	s.handle("/v1/models", http.MethodGet, s.models)
	s.handle("/v1/models/{id...}", http.MethodGet, s.model)
	s.handle("/v1/resume/{id}", http.MethodPost, s.resume, "DELETE")
	s.mux.HandleFunc("DELETE /v1/resume/{id}", s.discard)
	s.handle("/metrics", http.MethodGet, s.metrics)
	s.handle("/healthz", http.MethodGet, s.health)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: ptr("not_found"),
			Message: "no route " + r.Method + " " + r.URL.Path + "; see README (Serving) for the endpoints"})
	})
	return s
}

// handle registers path for method; other methods get a 405 in OpenAI's
// error shape, whose Allow header lists method (with HEAD for GET) and
// others, the methods registered for path on their own.
func (s *Server) handle(path, method string, h http.HandlerFunc, others ...string) {
	allowed := append([]string{method}, others...)
	if method == http.MethodGet {
		allowed = append(allowed, http.MethodHead)
	}
	allow := strings.Join(allowed, ", ")
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", allow)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: r.Method + " " + r.URL.Path + ": use " + allow})
			return
		}
		h(w, r)
	})
}

// Ready hands the server its scheduler and tokenizer: from now on it
// serves requests.
func (s *Server) Ready(sc *sched.Scheduler, tok *tokenizer.Tokenizer) {
	s.ready.Store(&backend{sc: sc, tok: tok})
}

// Shutdown refuses new requests (503) and shuts the scheduler down: it
// waits for in-flight requests until ctx ends, then cancels the rest.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	if b := s.ready.Load(); b != nil {
		return b.sc.Shutdown(ctx)
	}
	return nil
}

// ServeHTTP implements http.Handler, counting responses by status.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w}
	s.mux.ServeHTTP(rec, r)
	code := rec.status()
	if rec.left || rec.code == 0 && r.Context().Err() != nil {
		code = 499 // the client left before the whole answer (nginx's code)
	}
	s.mu.Lock()
	s.byCode[code]++
	s.mu.Unlock()
}

// backend returns the scheduler, or the 503 to send.
func (s *Server) backend() (*backend, *apiError) {
	if s.closing.Load() {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: ptr("shutting_down"),
			Message: "the server is shutting down"}
	}
	b := s.ready.Load()
	if b == nil {
		return nil, notLoaded()
	}
	return b, nil
}

func (s *Server) retryAfter() time.Duration {
	if b := s.ready.Load(); b != nil {
		return b.sc.RetryAfter()
	}
	return time.Second
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	b, err := s.backend()
	if err != nil {
		status := "loading"
		if s.closing.Load() {
			status = "shutting_down"
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": status, "model": s.cfg.Model})
		return
	}
	code, body := healthOf(b.sc.Stats())
	body["model"], body["calibrated"] = s.cfg.Model, b.sc.Estimator().Calibrated()
	writeJSON(w, code, body)
}

// stallLimit is how long requests may wait with every lane idle before
// /healthz reports the scheduler stalled.
const stallLimit = 5 * time.Second

// healthOf is /healthz's answer for a serving scheduler: ok, or 503
// "stalled" when requests have waited stallLimit with every lane idle
// (a scheduler bug: restarting the server frees them), so a supervisor
// can act on it.
func healthOf(st sched.Stats) (int, map[string]any) {
	body := map[string]any{"status": "ok", "lanes": len(st.Lanes), "waiting": st.Waiting, "policy": st.Policy}
	if st.Stalled >= stallLimit {
		body["status"], body["stalled_seconds"] = "stalled", st.Stalled.Seconds()
		return http.StatusServiceUnavailable, body
	}
	return http.StatusOK, body
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject() modelObject {
	return modelObject{ID: s.cfg.Model, Object: "model", Created: s.created.Unix(), OwnedBy: "tandem"}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []modelObject{s.modelObject()}})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != s.cfg.Model {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: ptr("model_not_found"),
			Param: ptr("model"), Message: "model " + id + " does not exist; this server has " + s.cfg.Model})
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

// newID makes an unguessable request id; the prefix tells resume which
// response shape the request uses.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) randomSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

const (
	completionPrefix = "cmpl-"
	chatPrefix       = "chatcmpl-"
)

func isChatID(id string) bool { return strings.HasPrefix(id, chatPrefix) }

// recorder remembers the status a handler sent and passes flushes through
// (server-sent events need them).
type recorder struct {
	http.ResponseWriter
	code int
	left bool // the client left mid-answer (a stream cut short)
}

// clientLeft marks w's answer as cut short by the client.
func clientLeft(w http.ResponseWriter) {
	if rec, ok := w.(*recorder); ok {
		rec.left = true
	}
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) status() int {
	if r.code == 0 {
		return http.StatusOK
	}
	return r.code
}
