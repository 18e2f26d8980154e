package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard/domain"
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
		{"GET", "/oauth/connect", browser, "", 0, s.connectPage},
		{"POST", "/oauth/connect", browser, "", 0, s.connectStart},
		{"GET", "/oauth/callback", browser, "", 0, s.callback},
	}
	if s.deps.Metrics != nil {
		rs = append(rs, route{"GET", "/metrics", apiKey, domain.ScopeAdmin, 0, s.deps.Metrics.ServeHTTP})
	}
	return rs
}

// guard wraps a route in its deadline, body limit and access checks.
func (s *Server) guard(rt route) http.Handler {
	limit := rt.maxBody
	if limit <= 0 {
		limit = defaultMaxBody
	}
	h := http.Handler(rt.handle)
	if want, ok := publicRoutes[rt.pattern()]; !ok || want != rt.access {
		// Claiming less than publicRoutes lists still needs a key.
		rt.access = apiKey
	}
	if rt.access == apiKey {
		h = s.requireKey(requireScope(rt, h))
	} else {
		// Bounded per address: a flood takes no time from key holders.
		h = s.public.limit(h, nil)
	}
	return s.bounded(h, limit)
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
		key, ok := bearer(r)
		if !ok || s.deps.Keys == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tokenguard"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "an API key is required (Authorization: Bearer <key>)", Code: "unauthorized"})
			return
		}
		acc, err := s.deps.Keys.Verify(r.Context(), key)
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
		if wait, ok := s.limits.allow(acc.ID); !ok {
			setRetryAfter(w, wait)
			writeJSON(w, http.StatusTooManyRequests, errorBody{Error: "rate limit of this API key exceeded; try again later", Code: "rate_limited"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), keyAccessKey{}, acc)))
	})
}

type keyAccessKey struct{}

// keyAccess is the request's verified key; outside requireKey one that
// may do nothing.
func keyAccess(ctx context.Context) domain.KeyAccess {
	a, ok := ctx.Value(keyAccessKey{}).(domain.KeyAccess)
	if !ok {
		return domain.KeyAccess{Scopes: []domain.Scope{}, Connections: []string{}}
	}
	return a
}

func keyName(ctx context.Context) string { return keyAccess(ctx).Name }

func bearer(r *http.Request) (domain.Secret, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > 512 {
		return domain.Secret{}, false
	}
	return domain.NewSecret(token), true
}

// edges apply to every request: nosniff, and the Host check against DNS
// rebinding.
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

// keyLimits is one token bucket per API key.
type keyLimits struct {
	rate  rate.Limit
	burst int
	mu    sync.Mutex
	keys  map[int32]*rate.Limiter
}

// allow takes a token from the key's bucket, or says how long until one.
func (k *keyLimits) allow(id int32) (time.Duration, bool) {
	k.mu.Lock()
	l, ok := k.keys[id]
	if !ok {
		l = rate.NewLimiter(k.rate, k.burst)
		k.keys[id] = l
	}
	k.mu.Unlock()
	d := take(l, time.Now())
	return d, d == 0
}

// take takes a token from l at now, or says how long until there is one.
func take(l *rate.Limiter, now time.Time) time.Duration {
	res := l.ReserveN(now, 1)
	d := res.DelayFrom(now)
	if d > 0 {
		res.CancelAt(now)
	}
	return d
}
