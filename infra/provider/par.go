package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// PAREndpoint says where the connect flow pushes its authorization
// request (RFC 9126), "" when it is not pushed: never with
// domain.PARNever; with domain.PARAlways whenever the metadata m (found
// says there is some) names an endpoint; with domain.PARAuto when the
// metadata or the profile (profileRequires) says pushing is required.
// Required without a known endpoint is domain.ErrNoPAREndpoint.
func PAREndpoint(mode domain.PARMode, profileRequires bool, m Metadata, found bool) (string, error) {
	switch mode {
	case domain.PARNever:
		return "", nil
	case domain.PARAlways:
	default: // auto
		if !profileRequires && !(found && m.RequirePAR) {
			return "", nil
		}
	}
	if !found || m.PAREndpoint == "" {
		return "", domain.ErrNoPAREndpoint
	}
	return m.PAREndpoint, nil
}

// errPushRefused: the PAR endpoint's answer has no request_uri.
var errPushRefused = errors.New("the pushed authorization request endpoint answered without a request_uri")

// Push sends the authorization request form to the pushed authorization
// request endpoint (RFC 9126 §2.1), the client authenticated as at the
// token endpoint (its secret in its auth style, or an assertion), and
// returns the request_uri the browser is then sent with. Errors are
// *domain.ProviderError, naming the status and the error code only.
func (r *Refresher) Push(ctx context.Context, endpoint string, form url.Values) (string, error) {
	var uri string
	pe := r.authenticated(ctx, false, func(style oauth2.AuthStyle) *domain.ProviderError {
		req, err := r.requestTo(ctx, endpoint, maps.Clone(form), style)
		if err != nil {
			return &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: err}
		}
		resp, err := r.client.Do(req)
		if err != nil {
			return &domain.ProviderError{Err: err}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
		f, _ := parseAnswer(resp.Header.Get("Content-Type"), body)
		if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK {
			if uri = f.str("request_uri"); uri == "" {
				return &domain.ProviderError{HTTPStatus: resp.StatusCode, Class: domain.EndpointMisconfigured, Err: errPushRefused}
			}
			return nil
		}
		pe := &domain.ProviderError{HTTPStatus: resp.StatusCode, Code: reportedCode(f.str("error")), Class: domain.EndpointMisconfigured,
			Err: fmt.Errorf("pushed authorization request: HTTP %d", resp.StatusCode)}
		if pe.Code == "invalid_client" || resp.StatusCode == http.StatusUnauthorized {
			pe.Class = domain.ClientRejected
		}
		return pe
	})
	if pe != nil {
		return "", pe
	}
	return uri, nil
}

// pusher also pushes authorization requests (Refresher, Retrying).
type pusher interface {
	Push(ctx context.Context, endpoint string, form url.Values) (string, error)
}

// Push pushes without retrying: the browser waits for it, and a person
// can start again.
func (r *Retrying) Push(ctx context.Context, endpoint string, form url.Values) (string, error) {
	p, ok := r.next.(pusher)
	if !ok {
		return "", fmt.Errorf("%T cannot push authorization requests", r.next)
	}
	return p.Push(ctx, endpoint, form)
}

// Push pushes an authorization request for provider ("" is the
// configuration's) through its refresher (see Refresher.Push).
func (r *Registry) Push(ctx context.Context, provider, endpoint string, form url.Values) (string, error) {
	ref := r.env
	if provider != "" {
		reg, ok := r.lookup(ctx, provider)
		if !ok {
			return "", fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
		}
		ref = reg.refresher
	}
	p, ok := ref.(pusher)
	if !ok {
		return "", fmt.Errorf("the refresher of provider %q cannot push authorization requests", provider)
	}
	return p.Push(ctx, endpoint, form)
}

// PARRequired reports whether provider's profile ("" the configuration's)
// says the provider refuses authorization requests that are not pushed.
func (r *Registry) PARRequired(provider string) bool { return r.profile(provider).PAR == "required" }
