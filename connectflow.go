package tokenguard

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
)

// ConnectFlow is one browser's authorization-code flow, from AuthCodeURL
// (which fills State and Verifier) to Complete. Keep it server-side, bound to
// that browser, never in a URL: Verifier is the PKCE secret (and DPoP key seed).
type ConnectFlow struct {
	Connection  string
	Provider    string // a stored provider; "" is New's oauth2.Config's
	RedirectURL string // "" is New's oauth2.Config's
	// AllowAccountChange lets a grant from another provider account replace the connection's.
	AllowAccountChange bool
	// Metadata (a JSON object) and Tags replace the connection's on Redeem; both nil keep its own.
	Metadata  json.RawMessage
	Tags      []string
	CreatedBy string // who asked for the flow, kept with the pending result
	State     string
	Verifier  string
}

// ConnectResult is a consent's grant, kept pending: nothing is stored for
// the connection until Redeem is called with Code.
type ConnectResult struct {
	Code          string // the one-time result code (tgr_…), valid until ExpiresAt
	Connection    string
	Account       string // the provider account that consented; "" when unknown
	Scopes        []string
	MissingScopes []string // requested but not granted
	ExpiresAt     time.Time
}

// Connected is a redeemed result: the grant is stored.
type Connected struct {
	Connection    string
	Provider      string
	Account       string
	Scopes        []string
	MissingScopes []string
}

// ConnectError says why Complete stored nothing, with a reason code a
// browser can be shown (bad_state, access_denied, ...). Match it with errors.As.
type ConnectError = domain.ConnectError

// ResultLifetime is how long a result waits for Redeem; after that its
// grant is revoked at the provider and deleted (SweepConnectResults).
const ResultLifetime = 10 * time.Minute

// AuthCodeURL starts the flow of f.Connection: it returns the provider's
// authorization URL (with the profile's parameters, such as prompt=consent),
// and f with a fresh State and Verifier to keep until the callback.
func (t *Tokens) AuthCodeURL(ctx context.Context, f ConnectFlow) (string, ConnectFlow, error) {
	if t.closed.Load() {
		return "", f, ErrClosed
	}
	if err := domain.ValidateName(f.Connection); err != nil {
		return "", f, err
	}
	if _, err := metadataOf(f); err != nil {
		return "", f, err
	}
	client, err := t.clientOf(ctx, f)
	if err != nil {
		return "", f, err
	}
	if client.Endpoint.AuthURL == "" {
		if f.Provider != "" {
			return "", f, fmt.Errorf("tokenguard: provider %q has no authorization URL (tokenctl provider update --auth-url): %w", f.Provider, ErrUnknownProvider)
		}
		return "", f, errors.New("tokenguard: AuthCodeURL: the oauth2.Config has no Endpoint.AuthURL")
	}
	if client.RedirectURL == "" {
		return "", f, errors.New("tokenguard: AuthCodeURL: no RedirectURL (the ConnectFlow's or the oauth2.Config's)")
	}
	f.RedirectURL = client.RedirectURL
	f.State, f.Verifier = rand.Text(), oauth2.GenerateVerifier()
	verifier, _, jkt, err := t.flowSecrets(f)
	if err != nil {
		return "", f, err
	}
	opts := append([]oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier)}, t.providers.AuthCodeOptions(f.Provider, client.Scopes)...)
	if _, resource := t.parOf(f); resource != "" {
		opts = append(opts, oauth2.SetAuthURLParam("resource", resource))
	}
	if jkt != "" {
		// RFC 9449 §10: the code is bound to the key the exchange proves.
		opts = append(opts, oauth2.SetAuthURLParam("dpop_jkt", jkt))
	}
	authURL, err := t.pushed(ctx, f, client, client.AuthCodeURL(f.State, opts...))
	return authURL, f, err // pushed returns "" with an error
}

// Complete handles the provider's redirect back (callback: its query) for f:
// it checks the state, redeems the code, finds the consenting account (the ID
// token's sub, else WithUserInfo) and keeps the grant pending for
// ResultLifetime. Nothing is stored until Redeem, once the application knows
// the browser was the asking user's: a link that reached another person must
// not give their grant to it. A flow the provider did not complete is a *ConnectError.
func (t *Tokens) Complete(ctx context.Context, f ConnectFlow, callback url.Values) (ConnectResult, error) {
	if t.closed.Load() {
		return ConnectResult{}, ErrClosed
	}
	if f.State == "" || subtle.ConstantTimeCompare([]byte(callback.Get("state")), []byte(f.State)) != 1 {
		return ConnectResult{}, &ConnectError{Code: "bad_state", Message: "The answer from the provider does not belong to this connection attempt."}
	}
	if e := callback.Get("error"); e != "" {
		code := oauthCode(e)
		return ConnectResult{}, &ConnectError{Code: code, Message: "The provider did not grant access (" + code + ")."}
	}
	code := callback.Get("code")
	if code == "" {
		return ConnectResult{}, &ConnectError{Code: "bad_request", Message: "The provider sent no authorization code."}
	}
	metadata, err := metadataOf(f)
	if err != nil {
		return ConnectResult{}, err
	}
	client, err := t.clientOf(ctx, f)
	if err != nil {
		return ConnectResult{}, &ConnectError{Code: "unknown_provider", Message: "The connection's provider is not known.", Err: err}
	}
	verifier, keyPEM, jkt, err := t.flowSecrets(f)
	if err != nil {
		return ConnectResult{}, err
	}
	grant, tok, err := t.providers.Exchange(ctx, f.Provider, code, client.RedirectURL, verifier, keyPEM)
	if err != nil {
		// Never the error's text: an answer's body is not ours to repeat.
		reason := "no answer"
		if pe, ok := errors.AsType[*domain.ProviderError](err); ok && pe.Code != "" {
			reason = oauthCode(pe.Code)
		}
		return ConnectResult{}, &ConnectError{Code: "exchange_failed", Message: "The provider did not redeem the authorization (" + reason + ")."}
	}
	accounts := t.o.userInfo
	if f.Provider != "" { // the user-info URL is cfg's provider's: another provider's token never goes there
		accounts = provider.AccountSource{HTTP: t.httpClient}
	}
	account, err := accounts.Account(ctx, tok)
	if err != nil {
		return ConnectResult{}, &ConnectError{Code: "account_unknown", Message: "The provider did not say which account granted access.", Err: err}
	}
	// No scope in the answer: it granted what was asked (RFC 6749 §5.1).
	granted := slices.Clone(client.Scopes)
	if s, ok := tok.Extra("scope").(string); ok {
		granted = domain.ScopeFields(s)
	}
	var missing []string
	for _, want := range client.Scopes {
		if !slices.Contains(granted, want) {
			missing = append(missing, want)
		}
	}
	p := domain.PendingGrant{Connection: f.Connection, Provider: f.Provider, CreatedBy: f.CreatedBy, AllowAccountChange: f.AllowAccountChange,
		Metadata: metadata, ProviderFields: t.providers.ProviderFields(f.Provider, callback, grant),
		Binding: domain.Binding{Account: account, Scopes: strings.Join(granted, " "), MissingScopes: strings.Join(missing, " ")},
		Grant:   grant, DPoPKey: keyPEM, DPoPJKT: jkt}
	secret, expires, err := t.flow.Keep(ctx, p)
	if err != nil {
		return ConnectResult{}, err
	}
	return ConnectResult{Code: secret.Reveal(), Connection: f.Connection, Account: account, Scopes: granted, MissingScopes: missing, ExpiresAt: expires}, nil
}

// Redeem stores the grant of the pending result code as Import does, in the
// transaction that deletes the result (else ErrResultInvalid). Another account
// than the connection's is ErrAccountMismatch unless the flow allowed it.
func (t *Tokens) Redeem(ctx context.Context, code string) (Connected, error) {
	return t.RedeemFor(ctx, code, nil)
}

// RedeemFor is Redeem for a caller limited to some connections: allow (nil:
// any) is asked first, and its error returned with the result unspent.
func (t *Tokens) RedeemFor(ctx context.Context, code string, allow func(connection string) error) (Connected, error) {
	if t.closed.Load() {
		return Connected{}, ErrClosed
	}
	tok, p, err := t.flow.Redeem(ctx, domain.NewSecret(code), allow)
	if err != nil {
		return Connected{Connection: p.Connection}, err
	}
	return Connected{Connection: tok.Connection, Provider: tok.Provider, Account: tok.Binding.Account,
		Scopes: strings.Fields(tok.Binding.Scopes), MissingScopes: strings.Fields(tok.Binding.MissingScopes)}, nil
}

// SweepConnectResults revokes (where it can) and deletes the grants of results
// not redeemed within ResultLifetime, and returns how many it deleted. Call it
// periodically in at least one process; concurrent sweeps share the work.
func (t *Tokens) SweepConnectResults(ctx context.Context) (int, error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	return t.flow.Sweep(ctx)
}

// clientOf is f's provider's client registration, with f's redirect URL.
func (t *Tokens) clientOf(ctx context.Context, f ConnectFlow) (*oauth2.Config, error) {
	c := new(*t.cfg)
	if f.Provider != "" {
		var err error
		if c, err = t.providers.ClientConfig(ctx, f.Provider); err != nil {
			return nil, err
		}
		c.RedirectURL = t.cfg.RedirectURL
	}
	c.RedirectURL = cmp.Or(f.RedirectURL, c.RedirectURL)
	return c, nil
}

func metadataOf(f ConnectFlow) (*domain.Metadata, error) {
	if f.Metadata == nil && f.Tags == nil {
		return nil, nil
	}
	m, err := domain.NewMetadata(f.Metadata, f.Tags)
	return &m, err
}

// oauthCode keeps an OAuth2 error code from outside printable and short.
func oauthCode(s string) string {
	const allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."
	out := []byte(cmp.Or(s[:min(len(s), 64)], "unknown"))
	for i, b := range out {
		if strings.IndexByte(allowed, b) < 0 {
			out[i] = '?'
		}
	}
	return string(out)
}
