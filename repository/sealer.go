package repository

import (
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// Sealer encrypts token values on their way into the tokenguard_tokens table and
// decrypts them on the way out. *tokencrypt.Keyring is one, and
// tokencrypt.Plaintext the one of a store without keys.
type Sealer interface {
	// Seal returns what to store for plaintext, bound to aad (the row and
	// column). The empty string must stay empty.
	Seal(plaintext, aad string) (string, error)
	// Open returns the plaintext of a stored value sealed with the same
	// aad, or an error wrapping domain.ErrUndecryptable.
	Open(stored, aad string) (string, error)
	// IsCurrent reports whether a stored value is already in the form Seal
	// produces now, so that Reseal can leave it alone.
	IsCurrent(stored string) bool
}

// Column names double as the second half of the additional data that binds
// a sealed value to its row and column.
const (
	colAccess  = "access_token"
	colRefresh = "refresh_token"
)

func aadFor(connection, column string) string { return connection + "/" + column }

// sealed returns t with its two credentials replaced by what is stored for
// them. The envelopes stay inside Secrets, so they never print either.
// An empty refresh token stays empty ("keep the stored one" to Save).
func sealed(s Sealer, t domain.Token) (domain.Token, error) {
	at, err := s.Seal(t.AccessToken.Reveal(), aadFor(t.Connection, colAccess))
	if err != nil {
		return domain.Token{}, fmt.Errorf("seal access token of %s: %w", t.Connection, err)
	}
	rt := ""
	if !t.RefreshToken.IsZero() {
		if rt, err = s.Seal(t.RefreshToken.Reveal(), aadFor(t.Connection, colRefresh)); err != nil {
			return domain.Token{}, fmt.Errorf("seal refresh token of %s: %w", t.Connection, err)
		}
	}
	t.AccessToken, t.RefreshToken = domain.NewSecret(at), domain.NewSecret(rt)
	return t, nil
}

// opened decrypts the two credential columns of a row of connection.
func opened(s Sealer, connection, access, refresh string) (at, rt string, err error) {
	if at, err = s.Open(access, aadFor(connection, colAccess)); err != nil {
		return "", "", fmt.Errorf("access token of %s: %w", connection, err)
	}
	if rt, err = s.Open(refresh, aadFor(connection, colRefresh)); err != nil {
		return "", "", fmt.Errorf("refresh token of %s: %w", connection, err)
	}
	return at, rt, nil
}
