package repository

import (
	"fmt"
	"strconv"

	"github.com/tokenguard/tokenguard/domain"
)

// Sealer encrypts token values on their way into the tokenguard_tokens table and
// decrypts them on the way out. *tokencrypt.Keyring is one, and
// tokencrypt.Plaintext the one of a store without keys.
type Sealer interface {
	// Seal returns what to store for plaintext, bound to aad. The empty
	// string must stay empty.
	Seal(plaintext, aad string) (string, error)
	// Open returns the plaintext of a stored value sealed with the same
	// aad, or an error wrapping domain.ErrUndecryptable.
	Open(stored, aad string) (string, error)
	// IsCurrent reports whether a stored value is already in the form Seal
	// produces now, so that Reseal can leave it alone.
	IsCurrent(stored string) bool
	// Bound reports whether a stored value is in the form Seal produces
	// now, whose aad names the row by its id and a version; the releases
	// before named it by the connection's name only.
	Bound(stored string) bool
}

// Column names are the last part of the additional data that binds a
// sealed value to its row and column.
const (
	colAccess  = "access_token"
	colRefresh = "refresh_token"
)

// seal is what a row's credentials are bound to: the connection's id
// (never reused: a re-created connection has another) and the row's
// version, the column every version fence and the rollback check read. A
// ciphertext moved to another connection, or copied back into its row
// from another version (with whatever sealed_version it had), does not
// open, so a rollback needs the key, not just write access to the table.
// Every write that gives the row a new version seals again (Store, Put,
// Reactivate); such rows store sealed_version NULL.
type seal struct {
	id      int32
	version int64
}

func (s seal) aad(column string) string {
	return "c" + strconv.FormatInt(int64(s.id), 10) + "/r" + strconv.FormatInt(s.version, 10) + "/" + column
}

// sealedAtAAD is the additional data of the earlier bound form, which
// named the version in the row's sealed_version column: a column written
// with the ciphertexts, so an older version's ciphertexts copied back
// together with it opened.
func sealedAtAAD(id int32, sealedVersion int64, column string) string {
	return "c" + strconv.FormatInt(int64(id), 10) + "/v" + strconv.FormatInt(sealedVersion, 10) + "/" + column
}

// legacyAAD is the additional data of values sealed by the previous
// release: the connection's name and the column.
func legacyAAD(connection, column string) string { return connection + "/" + column }

// sealed returns t with its two credentials replaced by what is stored for
// them, bound to at. The envelopes stay inside Secrets, so they never
// print either. An empty refresh token stays empty ("keep the stored one"
// to Save, which reseals the kept one with at).
func sealed(s Sealer, t domain.Token, at seal) (domain.Token, error) {
	a, err := s.Seal(t.AccessToken.Reveal(), at.aad(colAccess))
	if err != nil {
		return domain.Token{}, fmt.Errorf("seal access token of %s: %w", t.Connection, err)
	}
	rt := ""
	if !t.RefreshToken.IsZero() {
		if rt, err = s.Seal(t.RefreshToken.Reveal(), at.aad(colRefresh)); err != nil {
			return domain.Token{}, fmt.Errorf("seal refresh token of %s: %w", t.Connection, err)
		}
	}
	t.AccessToken, t.RefreshToken = domain.NewSecret(a), domain.NewSecret(rt)
	return t, nil
}

// opened decrypts the two credential columns of a row of connection at
// (its id and version), whose sealed_version column holds sealedVersion
// (0: NULL, the current form).
func opened(s Sealer, connection string, at seal, sealedVersion int64, access, refresh string) (a, rt string, err error) {
	open := func(stored, column string) (string, error) {
		switch {
		case !s.Bound(stored):
			return s.Open(stored, legacyAAD(connection, column))
		case sealedVersion == 0:
			return s.Open(stored, at.aad(column))
		case refusesSealedAt(s):
			return "", fmt.Errorf("%w: bound to its sealed_version column, and tokenctl rotate-key has resealed every row bound to its version (copied back from another version, or written around tokenguard)",
				domain.ErrUndecryptable)
		default:
			// Until tokenctl rotate-key: rows of the previous release.
			return s.Open(stored, sealedAtAAD(at.id, sealedVersion, column))
		}
	}
	if a, err = open(access, colAccess); err != nil {
		return "", "", fmt.Errorf("access token of %s: %w", connection, err)
	}
	if rt, err = open(refresh, colRefresh); err != nil {
		return "", "", fmt.Errorf("refresh token of %s: %w", connection, err)
	}
	return a, rt, nil
}

// onlyBound is the Sealer of a store where every value is in the bound
// form (tokenguard_seal_state, set by Reseal): a value in any other form
// is refused, since it was written around tokenguard or copied back from
// before the upgrade. versioned: every row is also bound to its version
// (the state's versioned column), and the form bound to the
// sealed_version column is refused too.
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

// refusesSealedAt reports whether s refuses the form bound to the
// sealed_version column.
func refusesSealedAt(s Sealer) bool {
	o, ok := s.(onlyBound)
	return ok && o.versioned
}

// sealsBound reports whether s seals in the bound form (a keyring, not a
// store without keys).
func sealsBound(s Sealer) bool {
	v, err := s.Seal("probe", "probe")
	return err == nil && s.Bound(v)
}
