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
	// defaultProxyMaxBody bounds a proxied request's body (Edges.ProxyMaxBody).
	defaultProxyMaxBody = 10 << 20
	// replayLimit: a request body up to this size is held in memory, so
	// the request can be sent again after a 401 or a Retry-After; a larger
	// one is streamed, once.
	replayLimit = 1 << 20
	// retryWithin bounds the waits of the Retry-After retries of one
	// request (inside its own deadline).
	retryWithin = 10 * time.Second
	maxRetries  = 2
)

// forwardedHeaders are the request headers the proxy passes on. Anything
// else stays here: Authorization (the caller's API key) and Cookie above
// all.
var forwardedHeaders = []string{
	"Accept", "Accept-Encoding", "Accept-Language", "Cache-Control", "Content-Encoding", "Content-Language",
	"Content-Type", "Idempotency-Key", "If-Match", "If-Modified-Since", "If-None-Match", "If-Range",
	"If-Unmodified-Since", "Prefer", "Range", "Traceparent", "Tracestate", "X-Request-Id",
}

// call is one proxied request, for the proxy's Rewrite and transport.
type call struct {
	connection string
	target     *url.URL
	header     http.Header // forwarded
	cred       tokenguard.Credential
}

type callKey struct{}

// proxy answers ANY /connections/{name}/proxy/{path...}: the request,
// with the headers of forwardedHeaders and the connection's access token,
// to the API base URL of the connection's provider.
// proxyMethods are the methods an API call uses; the proxy forwards
// nothing else.
var proxyMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name") // validated by requireScope
	if !slices.Contains(proxyMethods, r.Method) {
		// TRACE would echo the injected token; CONNECT is no API call.
		// Refused before the token is looked up.
		w.Header().Set("Allow", strings.Join(proxyMethods, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "the proxy forwards " + strings.Join(proxyMethods, ", ") + " only", Code: "method_not_allowed", Connection: name})
		return
	}
	path := r.PathValue("path")
	// The call must stay under the provider's API base URL, whatever the
	// upstream's parser makes of the path: checked raw, as sent.
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
	s.forward(w, r, name, "/"+path, r.URL.RawQuery, h)
}

// resource answers GET /connections/{name}/resource: a GET of ResourcePath.
func (s *Server) resource(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name") // validated by requireScope
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

// newReverseProxy is the proxy under forward: streamed both ways, the
// answer without cookies, tokenguard's own errors as JSON.
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
			// Cookies are the API's for its client, which is tokenguard,
			// not the caller.
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
				s.deps.Log.Warn("proxy: upstream unreachable", "connection", name, "err", scrubURL(err))
				writeError(w, name, fmt.Errorf("%w: %w", apiclient.ErrUnavailable, scrubURL(err)))
			}
		},
		ErrorLog:   slog.NewLogLogger(s.deps.Log.Handler(), slog.LevelWarn),
		BufferPool: copyBuffers{},
	}
}

// copyBuffers keeps the proxy's 32 KiB copy buffers between calls:
// ReverseProxy allocates one per call otherwise, which at a thousand
// calls a second is garbage the collector's pauses then show in the tail.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// errTokens marks the token layer's errors through the reverse proxy.
var errTokens = errors.New("token")

// tokenTransport sends a proxied call with the connection's token. A 401
// that says the token is no good is sent again once with a token newer
// than the one refused (a refresh only if nobody refreshed yet); a 429 or
// 503 with Retry-After is sent again, within retryWithin, for a request
// that may be repeated. Both only when the body can be sent again.
type tokenTransport struct {
	tokens Tokens
	next   http.RoundTripper
	log    *slog.Logger
}

func (t *tokenTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	ctx := out.Context()
	c := ctx.Value(callKey{}).(*call)
	body, err := bufferBody(out.Body)
	if err != nil {
		return nil, err
	}
	replayable := body.stream == nil
	cred, refreshed, retries, nonced := c.cred, false, 0, false
	until := time.Now().Add(retryWithin)
	for {
		req := out.Clone(ctx)
		req.Body, req.ContentLength = body.reader(), body.length(out.ContentLength)
		if err := t.authorize(req, cred); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokens, err)
		}
		resp, err := t.next.RoundTrip(req)
		retryNonce := err == nil && t.nonceRefused(req, resp, cred)
		if err != nil || !replayable {
			return resp, err
		}
		switch {
		case retryNonce && !nonced:
			discard(resp)
			nonced = true
			continue
		case resp.StatusCode == http.StatusUnauthorized && !refreshed && apiclient.Revoked(resp.Header):
			next, ferr := t.tokens.ForceRefresh(ctx, c.connection, cred.Version)
			if ferr != nil && !errors.Is(ferr, domain.ErrNeedsReauth) {
				// No newer token (rate limited, provider down): the
				// caller gets the API's own 401.
				t.log.Warn("proxy: no newer token after a 401", "connection", c.connection, "err", ferr)
				return resp, nil
			}
			discard(resp)
			if ferr != nil {
				return nil, fmt.Errorf("%w: %w", errTokens, ferr)
			}
			cred, refreshed = next, true
			continue
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
			continue
		}
		return resp, nil
	}
}

// target is the URL of path?query at the provider's API.
func (s *Server) target(provider, path, query string) (*url.URL, error) {
	base := s.apiBase
	if provider != "" {
		// API_BASE_URL is the OAUTH_* provider's API: a stored provider's
		// token never goes there.
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
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	u.RawQuery = query
	return &u, nil
}

// scrubURL drops the URL (it can carry a query string) from a *url.Error.
func scrubURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// requestBody is a request body: held in memory when within replayLimit,
// so it can be sent again, else streamed once.
type requestBody struct {
	held   []byte
	stream io.Reader // nil when held
}

// bufferBody reads up to replayLimit bytes of body.
func bufferBody(body io.ReadCloser) (requestBody, error) {
	if body == nil || body == http.NoBody {
		return requestBody{}, nil
	}
	held, err := io.ReadAll(io.LimitReader(body, replayLimit+1))
	if err != nil || len(held) <= replayLimit {
		return requestBody{held: held}, err
	}
	return requestBody{stream: io.MultiReader(bytes.NewReader(held), body)}, nil
}

func (b requestBody) reader() io.ReadCloser {
	if b.stream != nil {
		return io.NopCloser(b.stream)
	}
	if len(b.held) == 0 {
		return nil
	}
	return io.NopCloser(bytes.NewReader(b.held))
}

// length is the outbound Content-Length: the held body's, or the caller's
// (-1, unknown, streams it chunked).
func (b requestBody) length(caller int64) int64 {
	if b.stream != nil {
		return caller
	}
	return int64(len(b.held))
}

// repeatable: a request the API may receive twice with the effect of one.
// POST and PATCH only with an Idempotency-Key.
func repeatable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return r.Header.Get("Idempotency-Key") != ""
}

// retryWait is how long to wait before retrying an answer with
// Retry-After; false when it has none or the wait ends after until or the
// request's deadline.
func retryWait(ctx context.Context, h http.Header, until time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	wait := provider.RetryAfter(v, time.Now())
	if wait == 0 && strings.TrimSpace(v) != "0" {
		return 0, false // unreadable, or a date already past
	}
	end := time.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && end.After(dl.Add(-time.Second)) {
		return 0, false
	}
	return wait, !end.After(until)
}

// discard reads a little of an unused answer, so its connection can be
// reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
