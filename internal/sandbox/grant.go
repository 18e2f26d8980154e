package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"golang.org/x/oauth2"
)

// Grant runs the authorization-code flow over HTTP against the provider that
// cfg.Endpoint points to (see Endpoint and Provider.OAuth2Config): it calls
// the authorization endpoint without following its redirect, takes code and
// state from the Location header, checks state and exchanges the code with
// cfg.Exchange. cfg.RedirectURL must be one of Options.RedirectURIs. The HTTP
// client in ctx under oauth2.HTTPClient is used if present.
//
// Errors never contain the authorization code or tokens. Token endpoint
// failures are returned as *oauth2.RetrieveError (wrapped).
func Grant(ctx context.Context, cfg *oauth2.Config) (*oauth2.Token, error) {
	code, err := authorize(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tok, err := cfg.Exchange(ctx, code)
	if err != nil {
		return nil, fmt.Errorf("sandbox: code exchange: %w", err)
	}
	return tok, nil
}

// authorize performs the authorization request and returns the code.
func authorize(ctx context.Context, cfg *oauth2.Config) (string, error) {
	state := rand.Text()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.AuthCodeURL(state), nil)
	if err != nil {
		return "", fmt.Errorf("sandbox: authorization request: %w", err)
	}
	resp, err := noRedirectClient(ctx).Do(req)
	if err != nil {
		return "", fmt.Errorf("sandbox: authorization request: %w", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()

	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		var e struct {
			Error       string `json:"error"`
			Description string `json:"error_description"`
		}
		_ = json.Unmarshal(body, &e)
		return "", fmt.Errorf("sandbox: authorization endpoint answered %s without redirect: %s %s", resp.Status, e.Error, e.Description)
	}
	// Do not put the Location (or URL parse errors quoting it) into errors:
	// it carries the authorization code.
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return "", errors.New("sandbox: authorization redirect has an unparsable Location")
	}
	q := loc.Query()
	if e := q.Get("error"); e != "" {
		return "", fmt.Errorf("sandbox: authorization failed: %s: %s", e, q.Get("error_description"))
	}
	if q.Get("state") != state {
		return "", errors.New("sandbox: authorization redirect has a wrong state")
	}
	code := q.Get("code")
	if code == "" {
		return "", errors.New("sandbox: authorization redirect has no code")
	}
	return code, nil
}

func noRedirectClient(ctx context.Context) *http.Client {
	c := &http.Client{}
	if hc, ok := ctx.Value(oauth2.HTTPClient).(*http.Client); ok && hc != nil {
		cp := *hc
		c = &cp
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}
