package provider

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/tokenguard/tokenguard/domain"
)

// Pauses of an unreachable token endpoint: as short as a rejected client's
// at first (the provider may be restarting), growing while it stays away.
const (
	DefaultPauseAfter = 3 // unreachable tries in a row before the first pause
	pauseFirst        = 250 * time.Millisecond
	pauseMax          = 4 * time.Second
)

// pause holds back the calls to a token endpoint that could not be reached
// (connection refused, no route, DNS, TLS) several times in a row: no
// answer will come from it soon, so every caller, whichever connection it
// refreshes, fails at once with the last failure instead of retrying until
// its refresh timeout while holding its connection's lock. An answer of
// any kind from the endpoint ends the pause.
type pause struct {
	after int // failures in a row that start a pause; <= 0: never

	mu       sync.Mutex
	failures int
	until    time.Time
	cause    error
	pauses   *backoff.ExponentialBackOff
}

// check returns the failure that pauses the calls at now, or nil.
func (p *pause) check(now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !now.Before(p.until) {
		return nil
	}
	return &domain.ProviderError{Err: fmt.Errorf("token endpoint not called for %v after it was unreachable: %w",
		p.until.Sub(now).Round(time.Millisecond), p.cause)}
}

// record takes the outcome of a try made at now, and reports whether it
// started a pause.
func (p *pause) record(now time.Time, err error) (paused bool) {
	if p.after <= 0 {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up: says nothing about the endpoint
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !unreachable(err) {
		p.failures, p.until, p.cause = 0, time.Time{}, nil
		if p.pauses != nil {
			p.pauses.Reset()
		}
		return false
	}
	p.failures++
	if p.failures < p.after || now.Before(p.until) {
		return false
	}
	if p.pauses == nil {
		p.pauses = &backoff.ExponentialBackOff{
			InitialInterval:     pauseFirst,
			RandomizationFactor: 0.2, // processes that start pausing together do not call together
			Multiplier:          2,
			MaxInterval:         pauseMax,
		}
		p.pauses.Reset()
	}
	p.until, p.cause = now.Add(min(p.pauses.NextBackOff(), pauseMax)), err
	return true
}

// unreachable reports whether err says no request reached the token
// endpoint's HTTP server: nothing listens there, there is no route to it,
// its name does not resolve, or its TLS certificate or handshake fails.
// None of these gets better within a refresh's retries, and none spent the
// refresh token.
func unreachable(err error) bool {
	var pe *domain.ProviderError
	if err == nil || !errors.As(err, &pe) || pe.HTTPStatus != 0 || pe.Err == nil {
		return false
	}
	var (
		dns      *net.DNSError
		verify   *tls.CertificateVerificationError
		header   tls.RecordHeaderError
		alert    tls.AlertError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.Is(pe.Err, syscall.ECONNREFUSED) || errors.Is(pe.Err, syscall.EHOSTUNREACH) ||
		errors.Is(pe.Err, syscall.ENETUNREACH) || errors.As(pe.Err, &dns) || errors.As(pe.Err, &verify) ||
		errors.As(pe.Err, &header) || errors.As(pe.Err, &alert) || errors.As(pe.Err, &unknown) ||
		errors.As(pe.Err, &hostname) || errors.As(pe.Err, &invalid)
}
