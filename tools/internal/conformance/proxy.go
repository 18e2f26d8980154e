package conformance

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a Proxy does with the token requests it receives.
type Mode int32

const (
	// Pass forwards every request unchanged.
	Pass Mode = iota
	// Unavailable answers every request 503 temporarily_unavailable
	// without forwarding it: the server never sees the refresh token.
	Unavailable
	// RejectClient forwards every request with the client secret replaced
	// (in the Basic header or the form, wherever the client put it), so the
	// real server rejects the client itself (invalid_client), as it does
	// while a client secret is being rotated at the provider.
	RejectClient
)

// Answer is one token request as the proxy saw it. It holds no secret.
type Answer struct {
	GrantType string // grant_type of the request
	Auth      string // "basic", "post" or "none": where the client put its credentials
	ClientID  string // the client id the request presented (Basic user or client_id)
	Status    int
	Error     string        // OAuth2 error code of a non-200 JSON answer
	Injected  bool          // answered by the proxy (Unavailable), not the server
	At        time.Time     // when the request reached the proxy
	ExpiresIn time.Duration // expires_in of a 200 answer (0 if absent)
}

// Proxy stands in front of a token endpoint (tokenguard's OAUTH_TOKEN_URL
// points at it) and records every answer. It is safe for concurrent use.
type Proxy struct {
	target string
	client *http.Client
	mode   atomic.Int32

	mu      sync.Mutex
	answers []Answer
}

// NewProxy forwards to the token endpoint at tokenURL.
func NewProxy(tokenURL string) *Proxy {
	return &Proxy{target: tokenURL, client: &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// SetMode switches the proxy's behaviour for the requests that follow.
func (p *Proxy) SetMode(m Mode) { p.mode.Store(int32(m)) }

// Mark is the number of answers recorded so far, for Since.
func (p *Proxy) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answers)
}

// Answers returns a copy of the answers recorded from mark on.
func (p *Proxy) Answers(mark int) []Answer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Answer(nil), p.answers[min(mark, len(p.answers)):]...)
}

// Counts summarises answers.
type Counts struct {
	Requests      int // token requests received
	Refreshed     int // refresh_token grants answered 200
	InvalidGrant  int // answered invalid_grant
	InvalidClient int // answered invalid_client (or a bare 401)
	Injected      int // answered 503 by the proxy itself
	Other         int // any other non-200 answer from the server
}

// Since counts the answers recorded from mark on.
func (p *Proxy) Since(mark int) Counts {
	return Count(p.Answers(mark))
}

// Count summarises answers.
func Count(answers []Answer) Counts {
	var c Counts
	for _, a := range answers {
		c.Requests++
		switch {
		case a.Injected:
			c.Injected++
		case a.Status == http.StatusOK && a.GrantType == "refresh_token":
			c.Refreshed++
		case a.Status == http.StatusOK:
		case a.Error == "invalid_grant":
			c.InvalidGrant++
		case a.Error == "invalid_client" || (a.Error == "" && a.Status == http.StatusUnauthorized):
			c.InvalidClient++
		default:
			c.Other++
		}
	}
	return c
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "proxy: reading the request failed", http.StatusBadRequest)
		return
	}
	form, _ := url.ParseQuery(string(body))
	a := Answer{GrantType: form.Get("grant_type"), Auth: "none", At: time.Now()}
	id, secret, basic := r.BasicAuth()
	a.ClientID = form.Get("client_id")
	switch {
	case basic:
		a.Auth = "basic"
		// Basic credentials are form-encoded (RFC 6749 §2.3.1).
		if uid, err := url.QueryUnescape(id); err == nil {
			a.ClientID = uid
		}
	case form.Get("client_secret") != "":
		a.Auth = "post"
	}

	mode := Mode(p.mode.Load())
	if mode == Unavailable {
		a.Status, a.Error, a.Injected = http.StatusServiceUnavailable, "temporarily_unavailable", true
		p.record(a)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"temporarily_unavailable"}`))
		return
	}
	header := http.Header{}
	for _, k := range []string{"Authorization", "Content-Type", "Accept", "User-Agent"} {
		if v := r.Header.Get(k); v != "" {
			header.Set(k, v)
		}
	}
	if mode == RejectClient {
		const wrong = "-no-longer-valid"
		if basic {
			req := &http.Request{Header: http.Header{}}
			// Basic credentials are form-encoded (RFC 6749 §2.3.1); the
			// suffix needs no escaping.
			req.SetBasicAuth(id, secret+wrong)
			header.Set("Authorization", req.Header.Get("Authorization"))
		}
		if form.Has("client_secret") {
			form.Set("client_secret", form.Get("client_secret")+wrong)
			body = []byte(form.Encode())
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, p.target, bytes.NewReader(body))
	if err != nil {
		http.Error(w, "proxy: bad target", http.StatusInternalServerError)
		return
	}
	req.Header = header
	resp, err := p.client.Do(req)
	if err != nil {
		a.Status, a.Error = http.StatusBadGateway, "proxy_upstream_failed"
		if r.Context().Err() != nil {
			a.Error = "client_gone" // the client gave up first
		}
		p.record(a)
		http.Error(w, "proxy: upstream failed", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	a.Status = resp.StatusCode
	var fields struct {
		Error     string  `json:"error"`
		ExpiresIn float64 `json:"expires_in"`
	}
	_ = json.Unmarshal(out, &fields)
	if resp.StatusCode == http.StatusOK {
		a.ExpiresIn = time.Duration(fields.ExpiresIn * float64(time.Second))
	} else {
		a.Error = fields.Error
	}
	p.record(a)
	for _, k := range []string{"Content-Type", "Cache-Control", "Pragma", "WWW-Authenticate", "Retry-After"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

func (p *Proxy) record(a Answer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers = append(p.answers, a)
}
