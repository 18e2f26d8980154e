package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

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

// droppedHeaders are the upstream answer's headers the caller does not
// get: hop-by-hop (RFC 9110 §7.6.1) and cookies meant for tokenguard's
// own client, not the caller.
var droppedHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Set-Cookie", "Set-Cookie2",
}

// outbound is a request to a connection's API.
type outbound struct {
	method, path, query string
	header              http.Header
}

// proxy answers ANY /connections/{name}/proxy/{path...}: the request,
// with the headers of forwardedHeaders and the connection's access token,
// to the API base URL of the connection's provider.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := domain.ValidateName(name); err != nil {
		writeError(w, "", err)
		return
	}
	path := r.PathValue("path")
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			// The call must stay under the provider's API base URL.
			writeJSON(w, http.StatusBadRequest, errorBody{Error: "the path must not contain . or .. segments", Code: "bad_path", Connection: name})
			return
		}
	}
	h := http.Header{}
	for _, k := range forwardedHeaders {
		if v := r.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	s.forward(w, r, name, outbound{method: r.Method, path: "/" + path, query: r.URL.RawQuery, header: h})
}

// resource answers GET /connections/{name}/resource: the proxy to the
// fixed path ResourcePath.
func (s *Server) resource(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := domain.ValidateName(name); err != nil {
		writeError(w, "", err)
		return
	}
	r.Body = http.NoBody
	s.forward(w, r, name, outbound{method: http.MethodGet, path: ResourcePath, header: http.Header{"Accept": {"application/json"}}})
}

// forward calls the connection's API and streams the answer back. A 401
// that says the token is no good is retried once with a token newer than
// the one refused (a refresh only if nobody refreshed it yet); a 429 or
// 503 with Retry-After is retried, within retryWithin, for a request that
// may be repeated. Both only when the body can be sent again.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, name string, o outbound) {
	ctx := r.Context()
	body, replayable, err := bufferBody(r.Body)
	if err != nil {
		s.writeBodyError(w, name, err)
		return
	}
	cred, err := s.deps.Tokens.Credential(ctx, name)
	if err != nil {
		s.logFailure(r, name, err)
		writeError(w, name, err)
		return
	}
	target, err := s.target(cred.Provider, o)
	if err != nil {
		s.logFailure(r, name, err)
		writeError(w, name, err)
		return
	}
	refreshed, retries := false, 0
	until := time.Now().Add(retryWithin)
	for {
		req, err := http.NewRequestWithContext(ctx, o.method, target, body.reader())
		if err != nil {
			writeError(w, name, err)
			return
		}
		req.ContentLength = body.length(r.ContentLength)
		req.Header = o.header.Clone()
		req.Header.Set("Authorization", "Bearer "+cred.Token.AccessToken)
		if s.deps.UserAgent != "" {
			req.Header.Set("User-Agent", s.deps.UserAgent)
		}
		resp, err := s.upstream.RoundTrip(req)
		if err != nil {
			s.writeUpstreamError(w, r, name, err)
			return
		}
		if !replayable {
			s.stream(w, resp)
			return
		}
		switch {
		case resp.StatusCode == http.StatusUnauthorized && !refreshed && apiclient.Revoked(resp.Header):
			next, ferr := s.deps.Tokens.ForceRefresh(ctx, name, cred.Version)
			if ferr != nil && !errors.Is(ferr, domain.ErrNeedsReauth) {
				// No newer token (rate limited, provider down): the
				// caller gets the API's own 401.
				s.deps.Log.Warn("proxy: no newer token after a 401", "connection", name, "err", ferr)
				s.stream(w, resp)
				return
			}
			discard(resp)
			if ferr != nil {
				s.logFailure(r, name, ferr)
				writeError(w, name, ferr)
				return
			}
			cred, refreshed = next, true
			continue
		case (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) &&
			retries < maxRetries && repeatable(o):
			wait, ok := retryWait(ctx, resp.Header, until)
			if !ok {
				break
			}
			discard(resp)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				writeError(w, name, ctx.Err())
				return
			}
			retries++
			continue
		}
		s.stream(w, resp)
		return
	}
}

// target is the URL of o at the API of the provider's connections.
func (s *Server) target(provider string, o outbound) (string, error) {
	base := s.apiBase
	if provider != "" && s.deps.APIBases != nil {
		if b := s.deps.APIBases.APIBaseURL(provider); b != "" {
			u, err := url.Parse(b)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return "", fmt.Errorf("the API base URL of provider %s is not an http(s) URL", provider)
			}
			base = u
		}
	}
	if base == nil {
		return "", errors.New("no API base URL (API_BASE_URL)")
	}
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + o.path
	u.RawPath = ""
	u.RawQuery = o.query
	return u.String(), nil
}

// stream passes the upstream answer on: its status, its headers but the
// dropped ones, and its body as it comes.
func (s *Server) stream(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	dst := w.Header()
	for _, k := range resp.Header.Values("Connection") {
		for _, name := range strings.Split(k, ",") {
			resp.Header.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range droppedHeaders {
		resp.Header.Del(k)
	}
	for k, v := range resp.Header {
		dst[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the caller went away
			}
			// Streamed answers (server-sent events, long downloads) reach
			// the caller as they come.
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) writeUpstreamError(w http.ResponseWriter, r *http.Request, name string, err error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		s.writeBodyError(w, name, err)
	case r.Context().Err() != nil:
		writeError(w, name, r.Context().Err())
	default:
		s.deps.Log.Warn("proxy: upstream unreachable", "connection", name, "err", scrubURL(err))
		writeError(w, name, fmt.Errorf("%w: %w", apiclient.ErrUnavailable, scrubURL(err)))
	}
}

func (s *Server) writeBodyError(w http.ResponseWriter, name string, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{
			Error: fmt.Sprintf("request body over %d bytes (PROXY_MAX_BODY)", tooLarge.Limit), Code: "too_large", Connection: name})
		return
	}
	writeJSON(w, http.StatusBadRequest, errorBody{Error: "the request body could not be read", Code: "bad_request", Connection: name})
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

// bufferBody reads up to replayLimit bytes of body; replayable says all of
// it fit.
func bufferBody(body io.ReadCloser) (requestBody, bool, error) {
	if body == nil || body == http.NoBody {
		return requestBody{}, true, nil
	}
	held, err := io.ReadAll(io.LimitReader(body, replayLimit+1))
	if err != nil {
		return requestBody{}, false, err
	}
	if len(held) <= replayLimit {
		return requestBody{held: held}, true, nil
	}
	return requestBody{stream: io.MultiReader(bytes.NewReader(held), body)}, false, nil
}

func (b requestBody) reader() io.Reader {
	if b.stream != nil {
		return b.stream
	}
	if len(b.held) == 0 {
		return nil
	}
	return bytes.NewReader(b.held)
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
func repeatable(o outbound) bool {
	switch o.method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return o.header.Get("Idempotency-Key") != ""
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

// discard reads a little of an answer not passed on, so its connection can
// be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
