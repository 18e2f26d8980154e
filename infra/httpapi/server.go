// Package httpapi is the HTTP server: the token API, the proxy, events,
// the OAuth2 connect flow and health. Errors map to statuses in problem.
package httpapi

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
	"github.com/tokenguard/tokenguard/infra/httpapi/ratelimit"
	"github.com/tokenguard/tokenguard/infra/tracing"
)

// Tokens hands out connections' access tokens; *tokenguard.Tokens is one.
type Tokens interface {
	Credential(ctx context.Context, connection string) (tokenguard.Credential, error)
	// ForceRefresh returns a token newer than version stale.
	ForceRefresh(ctx context.Context, connection string, stale int64) (tokenguard.Credential, error)
	// DPoPProof signs a proof with a connection's key, which callers never see.
	DPoPProof(ctx context.Context, cred tokenguard.Credential, method, target, nonce string) (string, error)
	LearnDPoPNonce(target string, status int, h http.Header) (retry bool)
}

// ConnectFlows run the connect flow.
type ConnectFlows interface {
	AuthCodeURL(ctx context.Context, f tokenguard.ConnectFlow) (string, tokenguard.ConnectFlow, error)
	Complete(ctx context.Context, f tokenguard.ConnectFlow, callback url.Values) (tokenguard.ConnectResult, error)
	// RedeemFor redeems the result only if allow accepts its connection.
	RedeemFor(ctx context.Context, code string, allow func(connection string) error) (tokenguard.Connected, error)
}

// Deps are what the server is built from.
type Deps struct {
	Tokens Tokens
	// APIBaseURL is the API of the environment's provider's connections.
	APIBaseURL *url.URL
	// APIBases give a stored provider's API base URL; "" when it has none
	// (its calls are then refused, never sent to APIBaseURL).
	APIBases        interface{ APIBaseURL(provider string) string }
	UpstreamTimeout time.Duration // the wait for a proxied answer's headers (0: 10s)
	UserAgent       string        // sent with every proxied call
	// Events accepts events for the worker.
	Events interface {
		Enqueue(ctx context.Context, connection string, payload json.RawMessage) (int64, error)
	}
	Flows       ConnectFlows  // nil disables the connect flow
	Connections console.Pages // nil answers GET /connections 503
	// Providers gives a stored provider's client, else ErrUnknownProvider; nil: only "" (OAUTH_*).
	Providers interface {
		ClientConfig(ctx context.Context, provider string) (*oauth2.Config, error)
	}
	Keys console.KeyVerifier
	// Sessions store connect sessions and their browser flows. They and DB
	// use the browser routes' own small pool: a flood takes none from token reads.
	Sessions interface {
		Create(ctx context.Context, s domain.ConnectSession) (domain.Secret, time.Time, error)
		// Peek reads an unopened, unexpired session; else domain.ErrUnauthorized.
		Peek(ctx context.Context, token domain.Secret) (domain.ConnectSession, error)
		Open(ctx context.Context, token, flow domain.Secret, state, verifier string) (domain.ConnectSession, error)
		// Finish spends flow if its state is state; else domain.ErrUnauthorized.
		Finish(ctx context.Context, flow domain.Secret, state string) (domain.ConnectSession, error)
	}
	DB      interface{ PingContext(context.Context) error }
	OAuth   *oauth2.Config // the flow's client; nil or no AuthURL/RedirectURL: no /oauth/connect
	Metrics http.Handler   // GET /metrics, behind an admin key; nil: no route
	// Observer counts the outcomes of the connect flow.
	Observer interface{ ConnectOutcome(outcome string) }
	Log      *slog.Logger
	Edges    Edges
}

// Edges are the limits of the public listener.
type Edges struct {
	// PublicURL is where clients reach the server: connect URLs, the
	// accepted Host, and (https) a Secure __Host- flow cookie.
	PublicURL  *url.URL
	Hosts      []string // further accepted Host header values
	ReturnURLs []string // allowed prefixes of a connect session's return_to
	// Rate and Burst limit requests per API key (0: 100/s, twice Rate).
	Rate  rate.Limit
	Burst int
	// The public routes' limits per client address: rate (0: 20/s), burst (0: twice the rate).
	PublicRate     rate.Limit
	PublicBurst    int
	RequestTimeout time.Duration // every request's deadline (0: 30s)
	ProxyMaxBody   int64         // a proxied request's body limit (0: 10 MiB)
}

// ResourcePath is the external API path the apps call.
const ResourcePath = "/resource"

// Server is the HTTP app.
type Server struct {
	deps          Deps
	hosts         map[string]bool
	limits        *ratelimit.Limits[int32]  // per API key
	public        *ratelimit.Limits[string] // the public routes' limits per client address
	health        health
	rp            *httputil.ReverseProxy
	tracer        *tracing.Tracer
	console       Console                   // /console, when mounted
	consoleLimits *ratelimit.Limits[string] // the console's per address, apart from public
}

// Console is the operator console: it checks its own session and answers
// the requests the server's limits refuse (Retry-After set).
type Console interface {
	http.Handler
	TooManyRequests(w http.ResponseWriter, r *http.Request)
}

// MountConsole serves c at /console and under it. Call it before Handler.
func (s *Server) MountConsole(c Console) { s.console = c }

// New builds the server.
func New(d Deps) *Server {
	d.Log = cmp.Or(d.Log, slog.Default())
	e := &d.Edges
	e.RequestTimeout = positive(e.RequestTimeout, 30*time.Second)
	e.Rate = positive(e.Rate, 100)
	e.Burst = positive(e.Burst, int(2*e.Rate))
	e.ProxyMaxBody = positive(e.ProxyMaxBody, defaultProxyMaxBody)
	s := &Server{deps: d, hosts: allowedHosts(d.Edges), tracer: tracing.New(nil),
		limits: ratelimit.New[int32](e.Rate, e.Burst, 0, 0),
		public: newAddrLimits(d.Edges), consoleLimits: newAddrLimits(d.Edges)}
	upstream := apiclient.NewTransport(positive(d.UpstreamTimeout, 10*time.Second), 64)
	s.rp = s.newReverseProxy(tracing.Transport(upstream, nil))
	return s
}

// Handler routes exactly routes(), each behind its access class's checks.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern(), s.guard(rt))
	}
	if s.console != nil {
		h := s.bounded(limited(s.consoleLimits, s.console, s.console.TooManyRequests), defaultMaxBody)
		mux.Handle("/console", h)
		mux.Handle("/console/", h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorBody{Error: "no such route", Code: "not_found"})
	})
	// Health checks come every few seconds and say nothing worth a trace.
	return tracing.Handler(s.edges(mux), nil, "/healthz")
}

// Serve answers on ln until ctx is done, then lets requests finish within grace.
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

// healthz answers from the last database ping, at most a second old.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.health.check(r.Context(), s.deps.DB.PingContext); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": "database unreachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// openapiJSON describes routes(); TestOpenAPIMatchesRoutes keeps them in step.
//
//go:embed openapi.json
var openapiJSON []byte

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapiJSON)
}

// jwks answers the public halves of the client keys in use (private_key_jwt),
// for providers that fetch them (AT Protocol). Public by design.
func (s *Server) jwks(w http.ResponseWriter, _ *http.Request) {
	body := []byte(`{"keys":[]}`)
	if k, ok := s.deps.Tokens.(interface{ ClientJWKS() []byte }); ok {
		body = k.ClientJWKS()
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(body)
}

func (s *Server) event(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")     // validated by requireScope
	body, err := io.ReadAll(r.Body) // bounded by the route's body limit
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
		s.failed(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"event_id": id, "connection": name})
}

// failed logs err and answers it.
func (s *Server) failed(w http.ResponseWriter, r *http.Request, name string, err error) {
	s.logFailure(r, name, err)
	writeError(w, name, err)
}

func (s *Server) logFailure(r *http.Request, name string, err error) {
	if r.Context().Err() != nil {
		s.deps.Log.Debug("client went away", "method", r.Method, "path", r.URL.Path, "connection", name)
		return
	}
	p := problem.Of(err)
	level := slog.LevelInfo // the caller's mistake
	switch {
	case p.Status >= 500:
		level = slog.LevelError
	case p.Status == http.StatusConflict:
		level = slog.LevelWarn // an operator must reconnect it
	}
	s.deps.Log.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path,
		"connection", name, "status", p.Status, "err", err)
}

// errorBody is an error answer: a stable code and a message for people.
// Neither ever carries a token. A 403 says what the key lacks, the scope or
// the connection pattern, so that an operator knows which key to make.
type errorBody struct {
	Error        string       `json:"error"`
	Code         string       `json:"code"`
	MissingScope domain.Scope `json:"missing_scope,omitempty"`
	Connection   string       `json:"connection,omitempty"`
	Allowed      []string     `json:"allowed_connections,omitempty"` // the key's patterns
}

func writeError(w http.ResponseWriter, connection string, err error) {
	p := problem.Of(err)
	if p.RetryAfter > 0 {
		ratelimit.SetRetryAfter(w, p.RetryAfter)
	}
	writeJSON(w, p.Status, errorBody{Error: p.Message, Code: p.Code, Connection: connection})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	// Tokenguard-Error tells tokenguard's own errors from the API's answers the proxy passes on.
	if e, ok := v.(errorBody); ok {
		w.Header().Set("Tokenguard-Error", e.Code)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
