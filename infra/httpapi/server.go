// Package httpapi is the HTTP server app: it proxies calls to the external
// API with a connection's token, accepts events for the worker, runs the
// OAuth2 authorization-code flow that connects an account, and reports
// health. Errors are mapped to HTTP statuses here and nowhere else.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
)

// API is the external API as the server uses it.
type API interface {
	Get(ctx context.Context, connectionID, path string) (*apiclient.Response, error)
}

// Events accepts events for the worker.
type Events interface {
	Enqueue(ctx context.Context, connectionID string, payload json.RawMessage) (int64, error)
}

// Connector stores a newly granted token.
type Connector interface {
	Connect(ctx context.Context, connectionID string, g domain.Grant) (domain.Token, error)
}

// Pinger reports whether the database answers.
type Pinger interface {
	PingContext(ctx context.Context) error
}

// Deps are what the server is built from.
type Deps struct {
	API       API
	Events    Events
	Connector Connector
	DB        Pinger
	// OAuth is the client registration for the connect flow; nil or without
	// AuthURL/RedirectURL disables /oauth/connect.
	OAuth *oauth2.Config
	// OAuthHTTP is the client for the code exchange (nil: a 10s-timeout client).
	OAuthHTTP *http.Client
	// Metrics serves GET /metrics; nil leaves the route out.
	Metrics http.Handler
	Log     *slog.Logger
}

// ResourcePath is the external API path the apps call.
const ResourcePath = "/resource"

// Server is the HTTP app.
type Server struct {
	deps Deps
}

// New builds the server.
func New(d Deps) *Server {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.OAuthHTTP == nil {
		d.OAuthHTTP = &http.Client{
			Timeout:       10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &Server{deps: d}
}

// Handler routes the server's endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /connections/{name}/resource", s.resource)
	mux.HandleFunc("POST /connections/{name}/events", s.event)
	mux.HandleFunc("GET /oauth/connect", s.connect)
	mux.HandleFunc("GET /oauth/callback", s.callback)
	if s.deps.Metrics != nil {
		mux.Handle("GET /metrics", s.deps.Metrics)
	}
	return mux
}

// Serve answers on ln until ctx is done, then stops accepting connections,
// lets requests in flight finish (bounded by grace) and returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.deps.Log.Handler(), slog.LevelWarn),
		// Requests keep running on their own context during shutdown.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.deps.Log.Info("server listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.deps.DB.PingContext(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": "database unreachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// resource calls the external API with the connection's token and answers
// with the upstream status and body.
func (s *Server) resource(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := domain.ValidateConnectionID(name); err != nil {
		writeError(w, "", err)
		return
	}
	resp, err := s.deps.API.Get(r.Context(), name, ResourcePath)
	if err != nil {
		s.logFailure(r, name, err)
		writeError(w, name, err)
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	if resp.StatusCode >= 400 {
		s.deps.Log.Warn("upstream error", "connection", name, "status", resp.StatusCode)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
}

// event queues one event for the worker. The body, if any, must be JSON;
// it travels with the event.
func (s *Server) event(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := domain.ValidateConnectionID(name); err != nil {
		writeError(w, "", err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: "event body over 64 KiB", Code: "too_large"})
		return
	}
	var payload json.RawMessage
	if len(body) > 0 {
		if !json.Valid(body) {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: "event body is not valid JSON", Code: "bad_request"})
			return
		}
		payload = body
	}
	id, err := s.deps.Events.Enqueue(r.Context(), name, payload)
	if err != nil {
		s.logFailure(r, name, err)
		writeError(w, name, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"event_id": id, "connection": name})
}

func (s *Server) logFailure(r *http.Request, name string, err error) {
	if r.Context().Err() != nil {
		s.deps.Log.Debug("client went away", "method", r.Method, "path", r.URL.Path, "connection", name)
		return
	}
	p := classify(err)
	level := slog.LevelInfo // the caller's mistake
	switch {
	case p.status >= 500:
		level = slog.LevelError
	case p.status == http.StatusConflict:
		level = slog.LevelWarn // an operator must reconnect it
	}
	s.deps.Log.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path,
		"connection", name, "status", p.status, "err", err)
}
