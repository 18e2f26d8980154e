package repository

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// DefaultResealBatch is how many connections Reseal reads per query.
const DefaultResealBatch = 100

// ResealResult counts what Reseal did.
type ResealResult struct {
	Resealed  int  // rows rewritten with the current key and form, legacy plaintext included
	Current   int  // rows that already were
	OnlyBound bool // every token is now bound to its row's version: later processes refuse other forms
}

// boundForm matches a stored value in the bound form.
const boundForm = `'tg1:%:b:%'`

// markOnlyBound records, once every token is bound to its row's version, that none may be otherwise.
func (r *TokenRepository) markOnlyBound(ctx context.Context) (bool, error) {
	if !sealsBound(r.sealer) {
		return false, nil
	}
	other, err := scan[int64](ctx, r.db, "count tokens in another form", `SELECT count(*) FROM tokenguard_tokens WHERE access_token NOT LIKE `+boundForm+
		` OR (refresh_token <> '' AND refresh_token NOT LIKE `+boundForm+`) OR sealed_version IS NOT NULL`)
	if err != nil || other > 0 {
		return false, err // other: written meanwhile by a process of the previous release, run it again
	}
	err = exec(ctx, r.db, "record the bound form", `INSERT INTO tokenguard_seal_state (versioned) VALUES (true)
ON CONFLICT (only_bound) DO UPDATE SET versioned = true`)
	return err == nil, err
}

// selectStored reads a token row's credential columns into a tokenRow.
const selectStored = `
SELECT c.id AS lock_key, c.name, t.access_token, t.refresh_token, t.version, coalesce(t.sealed_version, 0) AS sealed_version
FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
`

// sealedNow: the row is sealed with the current key, in the form bound to its version.
func (r tokenRow) sealedNow(s Sealer) bool {
	return s.IsCurrent(r.AccessToken) && s.IsCurrent(r.RefreshToken) && r.SealedVersion == 0
}

// Reseal rewrites every stored token as the Sealer seals now, batch connections at a time (<= 0:
// DefaultResealBatch), each re-read under its lock (wait bounds the wait) so as never to write
// back a token a refresh replaced; the version stays. It stops at the first value it cannot open
// (domain.ErrUndecryptable); running it again is harmless.
func (r *TokenRepository) Reseal(ctx context.Context, batch int, wait time.Duration) (ResealResult, error) {
	if batch <= 0 {
		batch = DefaultResealBatch
	}
	var res ResealResult
	for after := int32(0); ; {
		rows, err := allRows(ctx, r.db, "read stored tokens", asIs[tokenRow], selectStored+"WHERE c.id > ? ORDER BY c.id LIMIT ?", after, batch)
		if err != nil {
			return res, err
		}
		if len(rows) == 0 {
			break
		}
		for _, row := range rows {
			after = row.LockKey
			resealed := false
			if !row.sealedNow(r.sealer) {
				if resealed, err = r.resealOne(ctx, row.Name, wait); err != nil {
					return res, fmt.Errorf("reseal %s: %w", row.Name, err)
				}
			}
			if resealed {
				res.Resealed++
			} else {
				res.Current++
			}
		}
	}
	keys, err := r.resealDPoPKeys(ctx, wait)
	res.Resealed += keys
	if err != nil {
		return res, err
	}
	res.OnlyBound, err = r.markOnlyBound(ctx)
	return res, err
}

func (r *TokenRepository) resealOne(ctx context.Context, connection string, wait time.Duration) (resealed bool, err error) {
	err = r.inLock(ctx, connection, wait, operatorHold, func(ctx context.Context, tx *gorm.DB) error {
		row, err := oneRow[tokenRow](ctx, tx, "read token", nil, selectStored+"WHERE c.name = ?", connection)
		if err != nil {
			return err
		}
		if row == nil || row.sealedNow(r.sealer) {
			return nil // gone, or a refresh stored it sealed with the current key meanwhile
		}
		t, err := row.domain(r.sealer)
		if err != nil {
			return err
		}
		if t, err = sealed(r.sealer, t, seal{row.LockKey, row.Version}); err != nil {
			return err
		}
		err = exec(ctx, tx, "write resealed token", `UPDATE tokenguard_tokens SET access_token = ?, refresh_token = ?, sealed_version = NULL WHERE connection_id = ? AND version = ?`,
			t.AccessToken.Reveal(), t.RefreshToken.Reveal(), row.LockKey, row.Version)
		resealed = err == nil
		return err
	})
	return resealed, err
}

// KeyCheck is what CheckKeys found.
type KeyCheck struct{ Stale int } // rows not sealed with the current key (plaintext or an older key)

// keyIDOf is a stored refresh token's key id ("" for plaintext), indexed.
const keyIDOf = `(CASE WHEN refresh_token LIKE 'tg1:%' THEN split_part(refresh_token, ':', 2) ELSE '' END)`

// CheckKeys opens one stored token per key id in use (a skip scan of their index), so that a
// process with a wrong or missing key fails at start-up (domain.ErrUndecryptable) in a time that
// does not grow with the table; only rows waiting for a new key are counted. Once Reseal recorded
// the bound form, the repository refuses any other: CheckKeys must run before it is shared.
func (r *TokenRepository) CheckKeys(ctx context.Context) (KeyCheck, error) {
	marked, err := scan[struct{ Bound, Versioned int64 }](ctx, r.db, "read the seal state",
		`SELECT count(*) AS bound, count(*) FILTER (WHERE versioned) AS versioned FROM tokenguard_seal_state`)
	if err != nil {
		return KeyCheck{}, err
	}
	if marked.Bound > 0 && sealsBound(r.sealer) {
		// Before any other goroutine uses the repository (start-up).
		base := r.sealer
		if o, already := base.(onlyBound); already {
			base = o.Sealer
		}
		r.sealer = onlyBound{Sealer: base, versioned: marked.Versioned > 0}
	}
	ids, err := allRows(ctx, r.db, "read key ids in use", asIs[string], `
WITH RECURSIVE k(id) AS (
    (SELECT `+keyIDOf+` FROM tokenguard_tokens ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT `+keyIDOf+` FROM tokenguard_tokens WHERE `+keyIDOf+` > k.id ORDER BY 1 LIMIT 1)
    FROM k WHERE k.id IS NOT NULL
)
SELECT id FROM k WHERE id IS NOT NULL`)
	if err != nil {
		return KeyCheck{}, err
	}
	var kc KeyCheck
	for _, id := range ids {
		row, err := oneRow[tokenRow](ctx, r.db, "read a stored token", nil, selectStored+"WHERE "+keyIDOf+" = ? LIMIT 1", id)
		if err != nil {
			return kc, err
		}
		if row == nil {
			continue // rewritten meanwhile
		}
		if _, err := row.domain(r.sealer); err != nil {
			return kc, err
		}
		if r.sealer.IsCurrent(row.AccessToken) && r.sealer.IsCurrent(row.RefreshToken) {
			continue
		}
		n, err := scan[int](ctx, r.db, "count tokens waiting for a new key", `SELECT count(*) FROM tokenguard_tokens WHERE `+keyIDOf+` = ?`, id)
		if err != nil {
			return kc, err
		}
		kc.Stale += n
	}
	return kc, nil
}
