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

type pusher interface {
	Push(ctx context.Context, endpoint string, form url.Values) (string, error)
}

// Push pushes without retrying: a person waits and can start again.
func (r *Retrying) Push(ctx context.Context, endpoint string, form url.Values) (string, error) {
	p, ok := r.next.(pusher)
	if !ok {
		return "", fmt.Errorf("%T cannot push authorization requests", r.next)
	}
	return p.Push(ctx, endpoint, form)
}

// Push pushes an authorization request for provider ("" the configuration's).
func (r *Registry) Push(ctx context.Context, provider, endpoint string, form url.Values) (string, error) {
	ref, err := r.refresherOf(ctx, provider)
	if err != nil {
		return "", err
	}
	p, ok := ref.(pusher)
	if !ok {
		return "", fmt.Errorf("the refresher of provider %q cannot push authorization requests", provider)
	}
	return p.Push(ctx, endpoint, form)
}

// PARRequired reports whether provider's profile requires pushed requests.
func (r *Registry) PARRequired(provider string) bool { return r.profile(provider).PAR == "required" }
