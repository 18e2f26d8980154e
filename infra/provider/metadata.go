package provider

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Metadata is what is read of a server's metadata (RFC 8414, OIDC Discovery).
type Metadata struct {
	Issuer        string `json:"issuer"`
	TokenEndpoint string `json:"token_endpoint"`
	PAREndpoint   string `json:"pushed_authorization_request_endpoint"`
	RequirePAR    bool   `json:"require_pushed_authorization_requests"`
}

// Discovery finds and caches a token endpoint's server metadata. A document
// counts only when its issuer is the candidate it was fetched for (RFC 8414
// §3.3) and it names the token endpoint, so a neighbour's is never taken.
type Discovery struct {
	client *http.Client
	mu     sync.Mutex
	cache  map[string]found
}

type found struct {
	m     Metadata
	ok    bool
	until time.Time
}

const (
	metadataTTL      = time.Hour
	noneTTL          = 5 * time.Minute
	discoveryTimeout = 5 * time.Second // all of one discovery's documents
)

// NewDiscovery fetches with client, which should be bounded.
func NewDiscovery(client *http.Client) *Discovery {
	return &Discovery{client: client, cache: map[string]found{}}
}

// Find returns the metadata of tokenURL's server, and whether there is any.
func (d *Discovery) Find(ctx context.Context, tokenURL string) (Metadata, bool) {
	now := time.Now()
	d.mu.Lock()
	f := d.cache[tokenURL]
	d.mu.Unlock()
	if now.Before(f.until) {
		return f.m, f.ok
	}
	f = found{until: now.Add(noneTTL)}
	fctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	for _, c := range candidates(tokenURL) {
		m, answered := d.fetch(fctx, c.doc)
		if strings.TrimSuffix(m.Issuer, "/") == c.issuer && m.TokenEndpoint == tokenURL {
			f = found{m: m, ok: true, until: now.Add(metadataTTL)}
			break
		}
		if ctx.Err() != nil {
			return Metadata{}, false // not kept: the caller gave up, not the server
		}
		if !answered {
			break
		}
	}
	d.mu.Lock()
	d.cache[tokenURL] = f
	d.mu.Unlock()
	return f.m, f.ok
}

type candidate struct{ issuer, doc string }

// candidates are tokenURL's possible metadata documents, longest issuer first,
// in RFC 8414's and OpenID Connect's forms.
func candidates(tokenURL string) []candidate {
	u, err := url.Parse(tokenURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil
	}
	origin := u.Scheme + "://" + u.Host
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	parts = parts[:len(parts)-1] // the endpoint itself; Split returns one part at least
	var out []candidate
	for n := len(parts); n >= 0; n-- {
		path := ""
		if n > 0 {
			path = "/" + strings.Join(parts[:n], "/")
		}
		iss := origin + path
		out = append(out, candidate{iss, origin + "/.well-known/oauth-authorization-server" + path},
			candidate{iss, iss + "/.well-known/openid-configuration"})
	}
	return out
}

// fetch reads one metadata document, zero when unusable; answered: an HTTP answer came.
func (d *Discovery) fetch(ctx context.Context, doc string) (m Metadata, answered bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, doc, nil)
	if err != nil {
		return Metadata{}, true
	}
	req.Header.Set("Accept", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return Metadata{}, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&m) != nil {
		return Metadata{}, true
	}
	return m, true
}
