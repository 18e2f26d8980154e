package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/provider"
)

const (
	defaultProxyMaxBody = 10 << 20 // Edges.ProxyMaxBody
	// replayLimit: a body up to this size is held, so it can be sent again
	// after a 401 or a Retry-After; a larger one is streamed, once.
	replayLimit = 1 << 20
	retryWithin = 10 * time.Second // the Retry-After waits of one request
	maxRetries  = 2
)

// forwardedHeaders are the request headers the proxy passes on; anything
// else, the caller's Authorization and Cookie above all, stays here.
var forwardedHeaders = []string{
	"Accept", "Accept-Encoding", "Accept-Language", "Cache-Control", "Content-Encoding", "Content-Language",
	"Content-Type", "Idempotency-Key", "If-Match", "If-Modified-Since", "If-None-Match", "If-Range",
	"If-Unmodified-Since", "Prefer", "Range", "Traceparent", "Tracestate", "X-Request-Id",
}

// call is one proxied request, for the Rewrite and the transport.
type call struct {
	connection string
	target     *url.URL
	header     http.Header // forwarded
	cred       tokenguard.Credential
}

type callKey struct{}

// proxyMethods are the methods the proxy forwards: TRACE would echo the
// injected token, CONNECT is no API call.
var proxyMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// proxy answers ANY /connections/{name}/proxy/{path...}: the request, with
// forwardedHeaders and the token, to the provider's API base URL.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !slices.Contains(proxyMethods, r.Method) {
		w.Header().Set("Allow", strings.Join(proxyMethods, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "the proxy forwards " + strings.Join(proxyMethods, ", ") + " only", Code: "method_not_allowed", Connection: name})
		return
	}
	// Checked raw, as sent: whatever the upstream makes of it, the call stays under the base URL.
	if err := domain.CheckPath(r.URL.EscapedPath()); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error(), Code: "bad_path", Connection: name})
		return
	}
	h := http.Header{}
	for _, k := range forwardedHeaders {
		if v := r.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	s.forward(w, r, name, "/"+r.PathValue("path"), r.URL.RawQuery, h)
}

// resource answers GET /connections/{name}/resource: a GET of ResourcePath.
func (s *Server) resource(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	r.Method, r.Body, r.ContentLength = http.MethodGet, http.NoBody, 0
	s.forward(w, r, name, ResourcePath, "", http.Header{"Accept": {"application/json"}})
}

// forward proxies r to path?query at the connection's API with its token.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, name, path, query string, h http.Header) {
	ctx, end := s.tracer.Call(r.Context(), "tokenguard.proxy", name, trace.SpanKindInternal)
	r = r.WithContext(ctx)
	c := &call{connection: name, header: h}
	var err error
	if c.cred, err = s.deps.Tokens.Credential(ctx, name); err == nil {
		c.target, err = s.target(c.cred.Provider, path, query)
	}
	if err != nil {
		end(err)
		s.failed(w, r, name, err)
		return
	}
	defer end(nil)
	s.rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, callKey{}, c)))
}

// newReverseProxy streams both ways, drops the answer's cookies and
// answers tokenguard's own errors as JSON.
func (s *Server) newReverseProxy(upstream http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			c := pr.In.Context().Value(callKey{}).(*call)
			pr.Out.URL = c.target
			pr.Out.Host = ""
			pr.Out.Header = c.header.Clone()
			pr.Out.Header.Set("User-Agent", s.deps.UserAgent) // "" sends none
		},
		Transport: &tokenTransport{tokens: s.deps.Tokens, next: upstream, log: s.deps.Log},
		ModifyResponse: func(resp *http.Response) error {
			// The API's cookies are for its client, tokenguard.
			resp.Header.Del("Set-Cookie")
			resp.Header.Del("Set-Cookie2")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			name := r.Context().Value(callKey{}).(*call).connection
			var tooLarge *http.MaxBytesError
			switch {
			case errors.As(err, &tooLarge):
				writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{
					Error: fmt.Sprintf("request body over %d bytes (PROXY_MAX_BODY)", tooLarge.Limit), Code: "too_large", Connection: name})
			case r.Context().Err() != nil:
				writeError(w, name, r.Context().Err())
			case errors.Is(err, errTokens):
				s.failed(w, r, name, err)
			default:
				if ue, ok := errors.AsType[*url.Error](err); ok {
					err = ue.Err // without the URL: it can carry a query string
				}
				s.deps.Log.Warn("proxy: upstream unreachable", "connection", name, "err", err)
				writeError(w, name, fmt.Errorf("%w: %w", apiclient.ErrUnavailable, err))
			}
		},
		ErrorLog:   slog.NewLogLogger(s.deps.Log.Handler(), slog.LevelWarn),
		BufferPool: copyBuffers{},
	}
}

// copyBuffers pools the proxy's 32 KiB copy buffers, which ReverseProxy
// would allocate per call (GC pauses in the latency tail).
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// errTokens marks the token layer's errors through the reverse proxy.
var errTokens = errors.New("token")

// tokenTransport sends a proxied call with the connection's token. With a
// replayable body it resends a 401 that refuses the token once with a newer
// one, and a repeatable request's 429 or 503 with Retry-After within retryWithin.
type tokenTransport struct {
	tokens Tokens
	next   http.RoundTripper
	log    *slog.Logger
}

func (t *tokenTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	ctx := out.Context()
	c := ctx.Value(callKey{}).(*call)
	var held []byte
	if out.Body != nil {
		var err error
		if held, err = io.ReadAll(io.LimitReader(out.Body, replayLimit+1)); err != nil {
			return nil, err
		}
	}
	replayable := len(held) <= replayLimit
	cred, refreshed, retries, nonced := c.cred, false, 0, false
	until := time.Now().Add(retryWithin)
	for {
		req := out.Clone(ctx) // with the caller's ContentLength
		switch {
		case !replayable: // streamed, once
			req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(held), out.Body))
		case len(held) > 0:
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(held)), int64(len(held))
		default:
			req.Body, req.ContentLength = nil, 0
		}
		if err := t.authorize(req, cred); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokens, err)
		}
		resp, err := t.next.RoundTrip(req)
		// The API's DPoP nonce is learned; a proof refused for want of it is sent again once (§9).
		retryNonce := err == nil && cred.DPoPJKT != "" && t.tokens.LearnDPoPNonce(req.URL.String(), resp.StatusCode, resp.Header)
		if err != nil || !replayable {
			return resp, err
		}
		switch {
		case retryNonce && !nonced:
			discard(resp)
			nonced = true
		case resp.StatusCode == http.StatusUnauthorized && !refreshed && apiclient.Revoked(resp.Header):
			next, ferr := t.tokens.ForceRefresh(ctx, c.connection, cred.Version)
			if ferr != nil && !errors.Is(ferr, domain.ErrNeedsReauth) {
				// No newer token: the caller gets the API's own 401.
				t.log.Warn("proxy: no newer token after a 401", "connection", c.connection, "err", ferr)
				return resp, nil
			}
			discard(resp)
			if ferr != nil {
				return nil, fmt.Errorf("%w: %w", errTokens, ferr)
			}
			cred, refreshed = next, true
		case (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) &&
			retries < maxRetries && repeatable(out):
			wait, ok := retryWait(ctx, resp.Header, until)
			if !ok {
				return resp, nil
			}
			discard(resp)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			retries++
		default:
			return resp, nil
		}
	}
}

// authorize gives a proxied request cred's token: Bearer, or DPoP with a
// proof for this very request (RFC 9449 §7).
func (t *tokenTransport) authorize(req *http.Request, cred tokenguard.Credential) error {
	if cred.DPoPJKT == "" {
		req.Header.Set("Authorization", "Bearer "+cred.Token.AccessToken)
		return nil
	}
	proof, err := t.tokens.DPoPProof(req.Context(), cred, req.Method, req.URL.String(), "")
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "DPoP "+cred.Token.AccessToken)
	req.Header.Set("DPoP", proof)
	return nil
}

// target is the URL of path?query at the provider's API.
func (s *Server) target(provider, path, query string) (*url.URL, error) {
	base := s.deps.APIBaseURL
	if provider != "" {
		// A stored provider's token never goes to API_BASE_URL.
		b := ""
		if s.deps.APIBases != nil {
			b = s.deps.APIBases.APIBaseURL(provider)
		}
		if b == "" {
			return nil, fmt.Errorf("provider %s: %w", provider, domain.ErrNoAPIBaseURL)
		}
		u, err := url.Parse(b)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("the API base URL of provider %s is not an http(s) URL", provider)
		}
		base = u
	}
	if base == nil {
		return nil, errors.New("no API base URL (API_BASE_URL)")
	}
	u := *base
	u.Path, u.RawPath, u.RawQuery = strings.TrimSuffix(u.Path, "/")+path, "", query
	return &u, nil
}

// repeatable: a request the API may receive twice with the effect of once;
// POST and PATCH only with an Idempotency-Key.
func repeatable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return r.Header.Get("Idempotency-Key") != ""
}

// retryWait is an answer's Retry-After; false without one or when the
// wait ends after until or the request's deadline.
func retryWait(ctx context.Context, h http.Header, until time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	wait := provider.RetryAfter(v, time.Now())
	if wait == 0 && strings.TrimSpace(v) != "0" {
		return 0, false // none, unreadable, or a date already past
	}
	end := time.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && end.After(dl.Add(-time.Second)) {
		return 0, false
	}
	return wait, !end.After(until)
}

// discard drains a little of an unused answer, for its connection's reuse.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
