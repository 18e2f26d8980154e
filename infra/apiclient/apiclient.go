// Package apiclient calls the external API with a connection's access
// token; its Transport recovers a 401 caused by another process's refresh.
package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tracing"
)

// Tokens hands out a connection's valid access token and, after a 401, a
// newer one; usecase.RefreshTokenUseCase implements it.
type Tokens interface {
	Token(ctx context.Context, connection string) (domain.Token, error)
	// ForceRefresh returns a token newer than version failed: the stored
	// one if another process already refreshed, else a refreshed one.
	ForceRefresh(ctx context.Context, connection string, failed int64) (domain.Token, error)
}

// Clients hands out a connection's *http.Client (see NewHTTPClient); *tokenguard.Tokens is one.
type Clients interface {
	Client(ctx context.Context, connection string) *http.Client
}

// NewHTTPClient is an *http.Client carrying connection's token from t over the transport of ctx's
// oauth2.HTTPClient (as oauth2.NewClient). It never follows a redirect: the token would go along.
func NewHTTPClient(ctx context.Context, t Tokens, connection string) *http.Client {
	var base http.RoundTripper
	if hc, ok := ctx.Value(oauth2.HTTPClient).(*http.Client); ok && hc != nil {
		base = hc.Transport
	}
	return &http.Client{
		Transport:     &Transport{Tokens: t, Connection: connection, Base: base},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Options tune a Client. Zero values take the defaults.
type Options struct {
	UserAgent string        // sent with Get's requests
	Timeout   time.Duration // bounds one HTTP exchange with the API (default 10s)
	Bases     Bases         // when set, sends a connection's calls to its provider's API
}

// maxBody caps an answer's body: a longer one is ErrTooLarge, never cut short.
const maxBody = 1 << 20

// Bases gives the API base URL of a connection's provider; "" for the Client's own.
type Bases interface {
	BaseURL(ctx context.Context, connection string) (string, error)
}

// Client calls the API at a base URL. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	clients Clients
	http    *http.Client // carries the shared transport to clients
	opts    Options
	tracer  *tracing.Tracer
}

// Response is an API answer, body included (at most maxBody).
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// StatusError is a non-2xx answer, as returned by Call.
type StatusError struct{ StatusCode int }

func (e *StatusError) Error() string {
	return fmt.Sprintf("external API answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// ErrUnavailable wraps failures to reach the API (network, timeout).
var ErrUnavailable = errors.New("external API unavailable")

// ErrTooLarge: the API's answer is longer than 1 MiB; none of it is returned.
var ErrTooLarge = errors.New("external API answer over the size limit")

// New returns a Client for the API at baseURL, authorising with clients.
func New(baseURL string, clients Clients, opts Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("apiclient: base URL %q is not an http(s) URL", baseURL)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	return &Client{base: u, clients: clients, opts: opts, tracer: tracing.New(nil),
		http: &http.Client{Transport: tracing.Transport(NewTransport(opts.Timeout, 32), nil)}}, nil
}

// NewTransport is the transport of API calls: headers within timeout,
// connecting within min(timeout, 5s), idlePerHost idle connections per host.
func NewTransport(timeout time.Duration, idlePerHost int) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: min(5*time.Second, timeout), KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   min(5*time.Second, timeout),
		ResponseHeaderTimeout: timeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   idlePerHost,
		ForceAttemptHTTP2:     true,
	}
}

// HTTPClient returns connection's *http.Client, for code that builds its own requests.
func (c *Client) HTTPClient(ctx context.Context, connection string) *http.Client {
	hc := c.clients.Client(context.WithValue(ctx, oauth2.HTTPClient, c.http), connection)
	hc.Timeout = c.opts.Timeout
	// Never forward the bearer token to wherever a redirect points.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return hc
}

// Get calls GET {base}{path} with connection's token and returns the answer
// whatever its status; errors wrap Tokens' domain errors or ErrUnavailable.
func (c *Client) Get(ctx context.Context, connection, path string) (_ *Response, err error) {
	ctx, end := c.tracer.Call(ctx, "tokenguard.api_call", connection, trace.SpanKindInternal)
	defer func() { end(err) }()
	base, err := c.baseOf(ctx, connection)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.JoinPath(path).String(), nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.opts.UserAgent != "" {
		req.Header.Set("User-Agent", c.opts.UserAgent)
	}
	resp, err := c.HTTPClient(ctx, connection).Do(req)
	if err != nil {
		if tokenErr, ok := errors.AsType[*tokenError](err); ok {
			return nil, tokenErr.err
		}
		return nil, fmt.Errorf("GET %s: %w: %w", path, ErrUnavailable, scrub(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read body: %w: %w", path, ErrUnavailable, scrub(err))
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("GET %s: %w (%d bytes)", path, ErrTooLarge, maxBody)
	}
	return &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

func (c *Client) baseOf(ctx context.Context, connection string) (*url.URL, error) {
	if c.opts.Bases == nil {
		return c.base, nil
	}
	s, err := c.opts.Bases.BaseURL(ctx, connection)
	if err != nil || s == "" {
		return c.base, err
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("apiclient: the API base URL of %s's provider is not an http(s) URL", connection)
	}
	return u, nil
}

// Call is Get for callers that only need to know it worked: a non-2xx answer is a *StatusError.
func (c *Client) Call(ctx context.Context, connection, path string) error {
	resp, err := c.Get(ctx, connection, path)
	if err != nil {
		return err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s for %s: %w", path, connection, &StatusError{StatusCode: resp.StatusCode})
	}
	return nil
}

// scrub drops a *url.Error's URL (its query may hold secrets), keeping the cause for errors.Is.
func scrub(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return fmt.Errorf("%s: %w", strings.ToLower(ue.Op), ue.Err)
	}
	return err
}
