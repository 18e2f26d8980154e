package tokenguard

import (
	"context"
	"crypto"
	"fmt"
	"net/http"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/usecase"
)

// ErrSenderConstrained: the grant is bound to a DPoP key (RFC 9449), so
// Token and TokenSource refuse it; Client signs a proof for every request.
var ErrSenderConstrained = domain.ErrSenderConstrained

// WithDPoP says the provider of New's oauth2.Config requires DPoP (RFC
// 9449): each grant the connect flow obtains is bound to a key of its own.
func WithDPoP() Option { return func(o *options) { o.dpop = true } }

// WithDPoPKey imports a grant the provider bound to key (EC P-256): the key
// is stored sealed with it and signs every request's proof.
func WithDPoPKey(key crypto.Signer) ImportOption {
	return func(r *usecase.ConnectRequest) error {
		k, err := dpop.FromSigner(key)
		if err != nil {
			return err
		}
		r.DPoPKey, r.DPoPJKT = domain.NewSecret(string(k.MarshalPEM())), k.Thumbprint()
		return nil
	}
}

// DPoPKey is the key connection's grant is bound to, opened once per
// process, and the nonces servers gave this process.
func (a apiTokens) DPoPKey(ctx context.Context, connection, jkt string) (*dpop.Key, *dpop.Nonces, error) {
	t := a.t
	cacheKey := connection + "\x00" + jkt
	if k, ok := t.dpopKeys.Load(cacheKey); ok {
		return k.(*dpop.Key), t.nonces, nil
	}
	pem, err := t.repo.DPoPKey(ctx, connection, jkt)
	if err != nil {
		return nil, nil, err
	}
	k, err := dpop.ParsePEM([]byte(pem.Reveal()))
	if err != nil {
		return nil, nil, fmt.Errorf("dpop key of %s: %w: %w", connection, domain.ErrUndecryptable, err)
	}
	if k.Thumbprint() != jkt {
		return nil, nil, fmt.Errorf("dpop key of %s: %w: its thumbprint is not the grant's", connection, domain.ErrUndecryptable)
	}
	t.dpopKeys.Store(cacheKey, k)
	return k, t.nonces, nil
}

// DPoPProof signs a proof of cred's DPoP key for one request (method, target)
// with nonce, or when "" the one learned from target's server. A bearer grant is ErrNotFound.
func (t *Tokens) DPoPProof(ctx context.Context, cred Credential, method, target, nonce string) (string, error) {
	if cred.DPoPJKT == "" {
		return "", fmt.Errorf("dpop key of %s: %w: a bearer grant", cred.Connection, ErrNotFound)
	}
	k, nonces, err := apiTokens{t}.DPoPKey(ctx, cred.Connection, cred.DPoPJKT)
	if err != nil {
		return "", err
	}
	if nonce == "" {
		nonce = nonces.For(target)
	}
	return k.Proof(method, target, cred.Token.AccessToken, nonce, time.Now())
}

// LearnDPoPNonce keeps the DPoP-Nonce of an answer from target's server,
// and reports whether the answer refused a proof for want of it (RFC 9449
// §9): such a request may go once more.
func (t *Tokens) LearnDPoPNonce(target string, status int, h http.Header) (retry bool) {
	return t.nonces.Learn(target, h) && dpop.NonceRefused(status, h, nil)
}

// flowSecrets are f's PKCE verifier and, with DPoP, its grant's key (PEM and
// thumbprint): both derive from f.Verifier, so nothing more is kept between the
// requests, and the provider, which sees the verifier, cannot derive the key.
func (t *Tokens) flowSecrets(f ConnectFlow) (verifier string, pem domain.Secret, jkt string, err error) {
	if !t.providers.DPoP(f.Provider, t.o.dpop) {
		return f.Verifier, domain.Secret{}, "", nil
	}
	if verifier, err = dpop.DeriveVerifier([]byte(f.Verifier)); err != nil {
		return "", domain.Secret{}, "", err
	}
	k, err := dpop.Derive([]byte(f.Verifier))
	if err != nil {
		return "", domain.Secret{}, "", err
	}
	return verifier, domain.NewSecret(string(k.MarshalPEM())), k.Thumbprint(), nil
}
