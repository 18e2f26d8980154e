package repository

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// dpopAAD binds a sealed DPoP key to its connection and thumbprint, not a version (a refresh keeps it).
func dpopAAD(id int32, jkt string) string {
	return "c" + strconv.FormatInt(int64(id), 10) + "/dpop_key/" + jkt
}

// putDPoPKey records, in the transaction storing a new grant of connection id, its DPoP key (PEM;
// zero for a bearer grant), sealed, and drops the keys of the grants it replaces.
func putDPoPKey(ctx context.Context, tx *gorm.DB, s Sealer, id int32, key domain.Secret, jkt string) error {
	if err := exec(ctx, tx, "drop replaced dpop keys", `DELETE FROM tokenguard_dpop_keys WHERE connection_id = ? AND jkt <> ?`, id, jkt); err != nil {
		return err
	}
	if key.IsZero() || jkt == "" {
		return exec(ctx, tx, "clear dpop binding", `UPDATE tokenguard_tokens SET dpop_jkt = NULL WHERE connection_id = ? AND dpop_jkt IS NOT NULL`, id)
	}
	sealedKey, err := s.Seal(key.Reveal(), dpopAAD(id, jkt))
	if err != nil {
		return fmt.Errorf("seal dpop key: %w", err)
	}
	if err := exec(ctx, tx, "store dpop key", `INSERT INTO tokenguard_dpop_keys (connection_id, jkt, private_key) VALUES (?, ?, ?)
ON CONFLICT (connection_id, jkt) DO UPDATE SET private_key = EXCLUDED.private_key`, id, jkt, sealedKey); err != nil {
		return err
	}
	return exec(ctx, tx, "bind grant to dpop key", `UPDATE tokenguard_tokens SET dpop_jkt = ? WHERE connection_id = ?`, jkt, id)
}

// DPoPKey returns the private key (PEM) of thumbprint jkt connection's grant is bound to:
// domain.ErrNotFound when there is none (replaced), domain.ErrUndecryptable when it cannot be opened.
func (r *TokenRepository) DPoPKey(ctx context.Context, connection, jkt string) (domain.Secret, error) {
	id, err := r.ids.lookup(ctx, r.db, connection)
	if err != nil {
		return domain.Secret{}, err
	}
	cacheKey := strconv.FormatInt(int64(id), 10) + "/" + jkt
	if v, ok := r.keys.Load(cacheKey); ok {
		return v.(domain.Secret), nil
	}
	stored, err := oneRow[string](ctx, r.db, "read dpop key", fmt.Errorf("dpop key %s of %s: %w", jkt, connection, domain.ErrNotFound),
		`SELECT private_key FROM tokenguard_dpop_keys WHERE connection_id = ? AND jkt = ?`, id, jkt)
	if err != nil {
		return domain.Secret{}, err
	}
	pem, err := r.sealer.Open(*stored, dpopAAD(id, jkt))
	if err != nil {
		return domain.Secret{}, fmt.Errorf("dpop key of %s: %w", connection, err)
	}
	key := domain.NewSecret(pem)
	r.keys.Store(cacheKey, key)
	return key, nil
}

type dpopKeyRow struct {
	ID         int32
	Name       string
	JKT        string `gorm:"column:jkt"`
	PrivateKey string
}

// resealDPoPKeys seals every DPoP key again with the current key, under its lock.
func (r *TokenRepository) resealDPoPKeys(ctx context.Context, wait time.Duration) (int, error) {
	rows, err := allRows(ctx, r.db, "read dpop keys", asIs[dpopKeyRow], `SELECT k.connection_id AS id, c.name, k.jkt, k.private_key
FROM tokenguard_dpop_keys k JOIN tokenguard_connections c ON c.id = k.connection_id ORDER BY k.connection_id`)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, row := range rows {
		if r.sealer.IsCurrent(row.PrivateKey) {
			continue
		}
		err := r.inLock(ctx, row.Name, wait, operatorHold, func(ctx context.Context, tx *gorm.DB) error {
			again, err := resealed(r.sealer, row.PrivateKey, dpopAAD(row.ID, row.JKT))
			if err != nil {
				return fmt.Errorf("dpop key of %s: %w", row.Name, err)
			}
			return tx.Exec(`UPDATE tokenguard_dpop_keys SET private_key = ? WHERE connection_id = ? AND jkt = ? AND private_key = ?`,
				again, row.ID, row.JKT, row.PrivateKey).Error
		})
		if err != nil {
			return n, fmt.Errorf("reseal dpop key of %s: %w", row.Name, err)
		}
		n++
	}
	return n, nil
}
