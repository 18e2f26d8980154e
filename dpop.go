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

// ErrSenderConstrained: the connection's grant is bound to a DPoP key
// (RFC 9449); Token and TokenSource refuse it, since a bare access token is
// useless to the caller. Call through Client, which signs a proof for
// every request.
var ErrSenderConstrained = domain.ErrSenderConstrained

// WithDPoP says the provider of New's oauth2.Config requires DPoP (RFC
// 9449): every grant the connect flow obtains is bound to a key of its
// own, made at connect time and stored sealed with the grant.
func WithDPoP() Option { return func(o *options) { o.dpop = true } }

// WithDPoPKey imports a grant bound to key (an EC P-256 private key) by
// the provider, obtained elsewhere: the key is sealed and stored with the
// grant, and every request for the connection (refreshes, Client's calls)
// carries a proof signed with it.
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

// DPoPKey is the key connection's grant is bound to, as Client signs its
// proofs with it, and the nonces servers gave this process
// (apiclient.Provers). Keys are opened once per process.
func (a apiTokens) DPoPKey(ctx context.Context, connection, jkt string) (*dpop.Key, *dpop.Nonces, error) {
	return a.t.dpopKey(ctx, connection, jkt)
}

func (t *Tokens) dpopKey(ctx context.Context, connection, jkt string) (*dpop.Key, *dpop.Nonces, error) {
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

// DPoPProof signs a proof of cred's connection's DPoP key for one request
// (method, target) that carries cred's access token (ath), with the nonce
// last learned from target's server, or nonce when not "". A bearer
// connection has no key: ErrNotFound.
func (t *Tokens) DPoPProof(ctx context.Context, cred Credential, method, target, nonce string) (string, error) {
	if cred.DPoPJKT == "" {
		return "", fmt.Errorf("dpop key of %s: %w: a bearer grant", cred.Connection, ErrNotFound)
	}
	k, nonces, err := t.dpopKey(ctx, cred.Connection, cred.DPoPJKT)
	if err != nil {
		return "", err
	}
	if nonce == "" {
		nonce = nonces.For(target)
	}
	return k.Proof(method, target, cred.Token.AccessToken, nonce, time.Now())
}

// LearnDPoPNonce keeps the DPoP-Nonce of an answer from target's server
// for the next proofs to it, and reports whether the answer refused a
// proof for want of it (RFC 9449 §9): such a request may go once more.
func (t *Tokens) LearnDPoPNonce(target string, status int, h http.Header) (retry bool) {
	return t.nonces.Learn(target, h) && dpop.NonceRefused(status, h, nil)
}

// boundKey is a new grant's DPoP key on its way to the store; zero for a
// bearer grant.
type boundKey struct {
	pem domain.Secret
	jkt string
}

func (k boundKey) IsZero() bool { return k.pem.IsZero() }

// flowSecrets are the PKCE verifier f's requests carry and, when its
// provider requires DPoP, the key its grant is bound to. For a bearer
// grant f.Verifier is the verifier. For a DPoP-bound one it is a seed both
// are derived from, so the authorization request names the key (dpop_jkt)
// and the code exchange proves it with nothing more kept between them,
// while the provider, which sees the verifier, cannot derive the key.
func (t *Tokens) flowSecrets(f ConnectFlow) (verifier string, key boundKey, err error) {
	if !t.providers.DPoP(f.Provider, t.dpop) {
		return f.Verifier, boundKey{}, nil
	}
	if verifier, err = dpop.DeriveVerifier([]byte(f.Verifier)); err != nil {
		return "", boundKey{}, err
	}
	k, err := dpop.Derive([]byte(f.Verifier))
	if err != nil {
		return "", boundKey{}, err
	}
	return verifier, boundKey{pem: domain.NewSecret(string(k.MarshalPEM())), jkt: k.Thumbprint()}, nil
}
