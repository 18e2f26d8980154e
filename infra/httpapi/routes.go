package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/ratelimit"
)

// access is who may call a route.
type access int

const (
	apiKey  access = iota // Bearer <API key>: every route not in publicRoutes
	browser               // the route checks its own credential (a connect session, a flow cookie)
	open                  // no credential (health checks)
)

// route is one endpoint: data, so that a test can walk the table. A route
// without a scope answers 403 to every key (fail-closed).
type route struct {
	method, path string // method "": any
	access       access
	scope        domain.Scope // "" for public routes
	maxBody      int64        // request body limit in bytes
	handle       http.HandlerFunc
}

func (rt route) pattern() string { return strings.TrimSpace(rt.method + " " + rt.path) }

// publicRoutes are the only routes reachable without an API key.
var publicRoutes = map[string]access{
	"GET /healthz":               open,
	"GET /openapi.json":          open,
	"GET /.well-known/jwks.json": open,
	"GET /oauth/connect":         browser,
	"POST /oauth/connect":        browser,
	"GET /oauth/callback":        browser,
}

// defaultMaxBody bounds the body of routes that expect a small one.
const defaultMaxBody = 16 << 10

func (s *Server) routes() []route {
	rs := []route{
		{"GET", "/healthz", open, "", 0, s.healthz},
		{"GET", "/connections/{name}/token", apiKey, domain.ScopeTokenRead, 0, s.token},
		{"POST", "/connections/{name}/token/refresh", apiKey, domain.ScopeTokenRead, 0, s.refreshToken},
		{"", "/connections/{name}/proxy/{path...}", apiKey, domain.ScopeAPICall, s.deps.Edges.ProxyMaxBody, s.proxy},
		{"GET", "/connections/{name}/resource", apiKey, domain.ScopeAPICall, 0, s.resource},
		{"POST", "/connections/{name}/dpop-proof", apiKey, domain.ScopeAPICall, 0, s.dpopProof},
		{"GET", "/openapi.json", open, "", 0, s.openapi},
		{"GET", "/.well-known/jwks.json", open, "", 0, s.jwks},
		{"POST", "/connections/{name}/events", apiKey, domain.ScopeAPICall, 64 << 10, s.event},
		// The connection is in the body: the handlers check it.
		{"POST", "/connect-sessions", apiKey, domain.ScopeConnect, 2 * defaultMaxBody, s.createSession},
		{"POST", "/connect-results", apiKey, domain.ScopeConnect, 0, s.redeem},
		{"GET", "/connections", apiKey, domain.ScopeConnectionsRead, 0, s.listConnections},
		{"GET", "/oauth/connect", browser, "", 0, s.flowConfigured(s.connectPage)},
		{"POST", "/oauth/connect", browser, "", 0, s.flowConfigured(s.connectStart)},
		{"GET", "/oauth/callback", browser, "", 0, s.flowConfigured(s.callback)},
	}
	if s.deps.Metrics != nil {
		rs = append(rs, route{"GET", "/metrics", apiKey, domain.ScopeAdmin, 0, s.deps.Metrics.ServeHTTP})
	}
	return rs
}

// guard wraps a route in its deadline, body limit and access checks.
func (s *Server) guard(rt route) http.Handler {
	h := http.Handler(rt.handle)
	// Claiming other than publicRoutes lists (an unlisted route: apiKey) needs a key.
	if rt.access == apiKey || publicRoutes[rt.pattern()] != rt.access {
		h = s.requireKey(requireScope(rt, h))
	} else {
		// Bounded per address: a flood takes no time from key holders.
		h = limited(s.public, h, nil)
	}
	return s.bounded(h, positive(rt.maxBody, defaultMaxBody))
}

func (s *Server) bounded(h http.Handler, limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.deps.Edges.RequestTimeout)
		defer cancel()
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// requireKey answers 401 without a valid API key, 429 over its rate.
func (s *Server) requireKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, key, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		key = strings.TrimSpace(key)
		if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" || len(key) > 512 || s.deps.Keys == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tokenguard"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "an API key is required (Authorization: Bearer <key>)", Code: "unauthorized"})
			return
		}
		acc, err := s.deps.Keys.Verify(r.Context(), domain.NewSecret(key))
		if errors.Is(err, domain.ErrUnauthorized) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tokenguard", error="invalid_token"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "the API key is not valid", Code: "unauthorized"})
			return
		}
		if err != nil {
			s.deps.Log.Error("API key check failed", "path", r.URL.Path, "err", err)
			writeError(w, "", err)
			return
		}
		if wait := s.limits.Take(acc.ID, time.Now()); wait > 0 {
			ratelimit.SetRetryAfter(w, wait)
			writeJSON(w, http.StatusTooManyRequests, errorBody{Error: "rate limit of this API key exceeded; try again later", Code: "rate_limited"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), keyAccessKey{}, acc)))
	})
}

// requireScope answers 403 unless domain.KeyAccess.Permit lets the key use
// the route's scope on the connection it names (then 400 for a bad name).
func requireScope(rt route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if !permit(w, keyAccess(r.Context()), rt.scope, name, "") {
			return
		}
		if err := domain.ValidateName(name); name != "" && err != nil {
			writeError(w, "", err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// permit answers 403 and false unless acc may use scope s on connection
// name ("": none named); what names what needed s, when not the route.
func permit(w http.ResponseWriter, acc domain.KeyAccess, s domain.Scope, name, what string) bool {
	err := acc.Permit(s, name)
	if err == nil {
		return true
	}
	b := errorBody{Code: "missing_scope", MissingScope: s}
	switch {
	case s == "" || !slices.Contains(domain.AllScopes, s):
		b = errorBody{Error: "this route declares no scope; no key may call it", Code: "missing_scope"}
	case errors.Is(err, domain.ErrMissingScope) && what != "":
		b.Error = what + " needs the scope " + string(s) + " (tokenctl apikey create --scopes)"
	case errors.Is(err, domain.ErrMissingScope):
		b.Error = "the API key lacks the scope " + string(s) + " (tokenctl apikey create --scopes)"
	default:
		b = errorBody{Error: "the API key's connection patterns do not match " + name + " (tokenctl apikey create --connections)",
			Code: "connection_not_allowed", Connection: name, Allowed: acc.Connections}
	}
	writeJSON(w, http.StatusForbidden, b)
	return false
}

type keyAccessKey struct{}

// keyAccess is the request's verified key; outside requireKey, one that may do nothing.
func keyAccess(ctx context.Context) domain.KeyAccess {
	if a, ok := ctx.Value(keyAccessKey{}).(domain.KeyAccess); ok {
		return a
	}
	return domain.KeyAccess{Scopes: []domain.Scope{}, Connections: []string{}}
}

// edges apply to every request: nosniff, and the Host check against DNS rebinding.
func (s *Server) edges(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		// Orchestrators address the pod, and /healthz says nothing.
		if r.URL.Path != "/healthz" && !s.hosts[strings.ToLower(r.Host)] {
			const msg = "unknown Host; set PUBLIC_URL to the address clients use"
			if strings.HasPrefix(r.URL.Path, "/oauth/") {
				s.page(w, r, http.StatusMisdirectedRequest, outcome{Code: "bad_host", Message: "This server is not reached by this address (" + msg + ")."})
				return
			}
			writeJSON(w, http.StatusMisdirectedRequest, errorBody{Error: msg, Code: "bad_host"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allowedHosts are PUBLIC_URL's host and e.Hosts, each also with its
// default port, and the loopback names for a loopback or wildcard listener.
func allowedHosts(e Edges) map[string]bool {
	out := map[string]bool{}
	add := func(hostport, scheme string) {
		hostport = strings.ToLower(hostport)
		if hostport == "" {
			return
		}
		host, port, err := net.SplitHostPort(hostport)
		if err != nil {
			out[hostport] = true
			port = "80"
			if scheme == "https" {
				port = "443"
			}
			out[net.JoinHostPort(strings.Trim(hostport, "[]"), port)] = true
			return
		}
		ip := net.ParseIP(host)
		wildcard := host == "" || (ip != nil && ip.IsUnspecified())
		if !wildcard {
			out[hostport] = true
		}
		if wildcard || host == "localhost" || (ip != nil && ip.IsLoopback()) {
			for _, h := range []string{"127.0.0.1", "localhost", "::1"} {
				out[net.JoinHostPort(h, port)] = true
			}
			return
		}
		if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
			out[host] = true
		}
	}
	if e.PublicURL != nil {
		add(e.PublicURL.Host, e.PublicURL.Scheme)
	}
	for _, h := range e.Hosts {
		add(h, "http")
	}
	return out
}

// positive is v, or def for a setting left 0.
func positive[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// newAddrLimits bound a public route's requests per client address (the
// TCP peer): 4 at once each, and 64 across all addresses.
func newAddrLimits(e Edges) *ratelimit.Limits[string] {
	r := positive(e.PublicRate, 20)
	return ratelimit.New[string](r, positive(e.PublicBurst, int(2*r)), 4, 64)
}

// limited answers 429 (refuse, or nil: JSON) to an address over its limits.
func limited(l *ratelimit.Limits[string], next http.Handler, refuse http.HandlerFunc) http.Handler {
	if refuse == nil {
		refuse = func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusTooManyRequests, errorBody{Error: "too many requests from this address; try again later", Code: "rate_limited"})
		}
	}
	if ControlBuild {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, wait := l.Acquire(ratelimit.ClientAddr(r))
		if release == nil {
			ratelimit.SetRetryAfter(w, wait)
			refuse(w, r)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

type health struct {
	mu  sync.Mutex
	at  time.Time
	err error
}

// check pings db unless the last ping is under a second old; callers wait for a ping in progress.
func (h *health) check(ctx context.Context, ping func(context.Context) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ControlBuild && !h.at.IsZero() && time.Since(h.at) < time.Second {
		return h.err
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	h.err = ping(pctx)
	h.at = time.Now()
	return h.err
}
