package domain

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// ErrInsecureURL: a URL that tokens, secrets or a session cookie travel to is http:// off loopback.
var ErrInsecureURL = errors.New("must be https (http only on loopback, or with ALLOW_INSECURE_URLS=true)")

// ErrNotHTTPURL: a setting that must be an absolute http(s) URL is not one.
var ErrNotHTTPURL = errors.New("must be an http(s) URL")

// CheckURL is the one check of every URL tokens or secrets travel to: an absolute http(s) URL,
// https unless on loopback or allowInsecure. Errors never repeat the URL (it may carry credentials).
func CheckURL(raw string, allowInsecure bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ErrNotHTTPURL
	}
	if u.Scheme == "http" && !allowInsecure && !IsLoopback(u.Hostname()) {
		return ErrInsecureURL
	}
	return nil
}

// IsLoopback reports whether host (without a port) is localhost or a loopback address.
func IsLoopback(host string) bool {
	return strings.EqualFold(host, "localhost") || net.ParseIP(host).IsLoopback() // a nil IP is no loopback
}

// CheckURLs applies CheckURL to the provider's URLs that are set; field names the first that fails.
func (p Provider) CheckURLs(allowInsecure bool) (field string, err error) {
	for _, f := range p.urls() {
		if err := CheckURL(f.v, allowInsecure); f.v != "" && err != nil {
			return f.name, fmt.Errorf("%w: %s %w", ErrInvalidProvider, f.name, err)
		}
	}
	return "", nil
}

// urlField is one URL setting of a provider, by the name errors give it.
type urlField struct{ name, v string }

// urls are the provider's URLs that tokens or secrets travel to.
func (p Provider) urls() []urlField {
	return []urlField{{"token URL", p.TokenURL}, {"auth URL", p.AuthURL},
		{"revocation URL", p.RevocationURL}, {"API base URL", p.APIBaseURL}}
}
