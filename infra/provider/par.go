package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// PAREndpoint says where the connect flow pushes its authorization request
// (RFC 9126), "" when it is not pushed; auto pushes when the metadata or the
// profile requires it. Required without an endpoint is ErrNoPAREndpoint.
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

var errPushRefused = errors.New("the pushed authorization request endpoint answered without a request_uri")

// Push sends the authorization request form to endpoint (RFC 9126 §2.1), the
// client authenticated as at the token endpoint, and returns the request_uri.
// Errors are *domain.ProviderError naming only the status and code.
func (r *Refresher) Push(ctx context.Context, endpoint string, form url.Values) (string, error) {
	var uri string
	pe := r.authenticated(ctx, false, func(style oauth2.AuthStyle) *domain.ProviderError {
		a, pe := r.post(ctx, endpoint, maps.Clone(form), style, false)
		if pe != nil && a.status == 0 {
			return pe
		}
		f, _ := parseAnswer(a.header.Get("Content-Type"), a.body) // a body cut short is read as far as it came
		if a.status == http.StatusCreated || a.status == http.StatusOK {
			if uri = f.str("request_uri"); uri == "" {
				return &domain.ProviderError{HTTPStatus: a.status, Class: domain.EndpointMisconfigured, Err: errPushRefused}
			}
			return nil
		}
		pe = &domain.ProviderError{HTTPStatus: a.status, Code: reportedCode(f.str("error")), Class: domain.EndpointMisconfigured,
			Err: fmt.Errorf("pushed authorization request: HTTP %d", a.status)}
		if pe.Code == "invalid_client" || a.status == http.StatusUnauthorized {
			pe.Class = domain.ClientRejected
		}
		return pe
	})
	if pe != nil {
		return "", pe
	}
	return uri, nil
}

// Push pushes an authorization request for provider ("" the configuration's).
func (r *Registry) Push(ctx context.Context, provider, endpoint string, form url.Values) (string, error) {
	ref, err := r.refresher(ctx, provider, "push authorization requests")
	if err != nil {
		return "", err
	}
	return ref.Push(ctx, endpoint, form)
}

// PARRequired reports whether provider's profile requires pushed requests.
func (r *Registry) PARRequired(provider string) bool { return r.profile(provider).PAR == "required" }
