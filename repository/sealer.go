package repository

import (
	"fmt"
	"strconv"

	"github.com/tokenguard/tokenguard/domain"
)

// Sealer encrypts token values into the tables and decrypts them out: *tokencrypt.Keyring, or tokencrypt.Plaintext.
type Sealer interface {
	// Seal returns what to store for plaintext, bound to aad; "" stays "".
	Seal(plaintext, aad string) (string, error)
	// Open returns the plaintext of a value sealed with aad, or an error wrapping domain.ErrUndecryptable.
	Open(stored, aad string) (string, error)
	// IsCurrent: a stored value is already as Seal makes it now (Reseal leaves it alone).
	IsCurrent(stored string) bool
	// Bound: a stored value is in the form whose aad names the row by id and version (not its name).
	Bound(stored string) bool
}

// Column names end the additional data binding a sealed value to its row.
const (
	colAccess  = "access_token"
	colRefresh = "refresh_token"
)

// seal is what a row's credentials are bound to: the connection's id (never reused) and the row's
// version. A ciphertext moved to another connection or copied back from another version does not
// open, so a rollback needs the key, not just write access to the table. Every write giving the
// row a new version seals again, with sealed_version NULL.
type seal struct {
	id      int32
	version int64
}

func (s seal) aad(column string) string {
	return "c" + strconv.FormatInt(int64(s.id), 10) + "/r" + strconv.FormatInt(s.version, 10) + "/" + column
}

// sealed returns t with its credentials sealed, bound to at (still Secrets: they never print); "" stays "".
func sealed(s Sealer, t domain.Token, at seal) (domain.Token, error) {
	a, err := s.Seal(t.AccessToken.Reveal(), at.aad(colAccess))
	if err != nil {
		return domain.Token{}, fmt.Errorf("seal access token of %s: %w", t.Connection, err)
	}
	rt, err := s.Seal(t.RefreshToken.Reveal(), at.aad(colRefresh)) // "" stays ""
	if err != nil {
		return domain.Token{}, fmt.Errorf("seal refresh token of %s: %w", t.Connection, err)
	}
	t.AccessToken, t.RefreshToken = domain.NewSecret(a), domain.NewSecret(rt)
	return t, nil
}

// resealed is stored sealed again as s seals now, with the same aad.
func resealed(s Sealer, stored, aad string) (string, error) {
	plain, err := s.Open(stored, aad)
	if err != nil {
		return "", err
	}
	return s.Seal(plain, aad)
}

// domain opens the row's credentials with s: one that fails to open is domain.ErrUndecryptable.
// A row's sealed_version 0 (NULL) is the current form, bound to its id and version.
func (r tokenRow) domain(s Sealer) (domain.Token, error) {
	at := seal{r.LockKey, r.Version}
	strict, _ := s.(onlyBound) // strict.versioned: the sealed_version form is refused
	open := func(stored, column string) (string, error) {
		switch {
		case !s.Bound(stored): // the releases before the bound form
			return s.Open(stored, r.Name+"/"+column)
		case r.SealedVersion == 0:
			return s.Open(stored, at.aad(column))
		case strict.versioned:
			return "", fmt.Errorf("%w: bound to its sealed_version column, and tokenctl rotate-key has resealed every row bound to its version (copied back from another version, or written around tokenguard)",
				domain.ErrUndecryptable)
		default:
			// Until rotate-key: rows bound to sealed_version (which a copy could bring back).
			return s.Open(stored, fmt.Sprintf("c%d/v%d/%s", at.id, r.SealedVersion, column))
		}
	}
	a, err := open(r.AccessToken, colAccess)
	if err != nil {
		return domain.Token{}, fmt.Errorf("access token of %s: %w", r.Name, err)
	}
	rt, err := open(r.RefreshToken, colRefresh)
	if err != nil {
		return domain.Token{}, fmt.Errorf("refresh token of %s: %w", r.Name, err)
	}
	t := r.record()
	t.AccessToken, t.RefreshToken = domain.NewSecret(a), domain.NewSecret(rt)
	return t, nil
}

// onlyBound is the Sealer of a store where Reseal bound every value: a value in another form was
// written around tokenguard or copied back, and is refused. versioned: every row is bound to its
// version, and the sealed_version form is refused too.
type onlyBound struct {
	Sealer
	versioned bool
}

func (o onlyBound) Open(stored, aad string) (string, error) {
	if stored != "" && !o.Sealer.Bound(stored) {
		return "", fmt.Errorf("%w: not in the bound form, and tokenctl rotate-key has resealed every row in it (rolled back to a value from before, or written around tokenguard)",
			domain.ErrUndecryptable)
	}
	return o.Sealer.Open(stored, aad)
}

// sealsBound reports whether s seals in the bound form (a keyring).
func sealsBound(s Sealer) bool {
	v, err := s.Seal("probe", "probe")
	return err == nil && s.Bound(v)
}
