package provider

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// DefaultPauseAfter is how many tries in a row may find the token endpoint
// unreachable before its calls pause (domain.UnreachablePause).
const DefaultPauseAfter = 3

// pause fails calls at once while an endpoint that could not be reached
// several times in a row pauses; any answer ends the pause.
type pause struct {
	off bool // never pause
	p   domain.Pause
}

func newPause(after int) *pause {
	policy := domain.UnreachablePause
	policy.After = after
	return &pause{off: after <= 0, p: domain.Pause{Policy: policy}}
}

// check returns the failure that pauses the calls at now, or nil.
func (p *pause) check(now time.Time) error {
	left, cause := p.p.Check(now)
	if cause == nil {
		return nil
	}
	return &domain.ProviderError{Err: fmt.Errorf("token endpoint not called for %v after it was unreachable: %w",
		left.Round(time.Millisecond), cause)}
}

// record takes a try's outcome and reports whether it started a pause.
func (p *pause) record(now time.Time, err error) (paused bool) {
	switch {
	case p.off || errors.Is(err, context.Canceled): // the caller gave up: says nothing about the endpoint
		return false
	case !unreachable(err):
		p.p.Succeed()
		return false
	}
	return p.p.Fail(now, err)
}

// unreachable: no request reached the HTTP server (refused, no route, DNS,
// TLS), so none spent the refresh token.
func unreachable(err error) bool {
	var pe *domain.ProviderError
	if err == nil || !errors.As(err, &pe) || pe.HTTPStatus != 0 || pe.Err == nil {
		return false
	}
	for _, errno := range []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(pe.Err, errno) {
			return true
		}
	}
	for _, target := range []any{new(*net.DNSError), new(*tls.CertificateVerificationError), new(tls.RecordHeaderError),
		new(tls.AlertError), new(x509.UnknownAuthorityError), new(x509.HostnameError), new(x509.CertificateInvalidError)} {
		if errors.As(pe.Err, target) {
			return true
		}
	}
	return false
}
