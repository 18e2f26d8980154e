package repository

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// dpopAAD binds a sealed DPoP key to its connection and its thumbprint: a
// key copied to another connection, or stored under another thumbprint,
// does not open. The key never changes for its thumbprint, so a refresh
// (a new version of the row) leaves it as it is.
func dpopAAD(id int32, jkt string) string {
	return "c" + strconv.FormatInt(int64(id), 10) + "/dpop_key/" + jkt
}

// putDPoPKey records, in the transaction that stores a new grant of
// connection id, the DPoP key the grant is bound to (key: PEM; zero for a
// bearer grant), sealed, and drops the keys of the grants it replaces:
// their refresh tokens are gone with them.
func putDPoPKey(ctx context.Context, tx *gorm.DB, s Sealer, id int32, key domain.Secret, jkt string) error {
	db := tx.WithContext(ctx)
	if err := db.Exec(`DELETE FROM tokenguard_dpop_keys WHERE connection_id = ? AND jkt <> ?`, id, jkt).Error; err != nil {
		return storeError(ctx, "drop replaced dpop keys", err)
	}
	if key.IsZero() || jkt == "" {
		return storeError(ctx, "clear dpop binding",
			db.Exec(`UPDATE tokenguard_tokens SET dpop_jkt = NULL WHERE connection_id = ? AND dpop_jkt IS NOT NULL`, id).Error)
	}
	sealedKey, err := s.Seal(key.Reveal(), dpopAAD(id, jkt))
	if err != nil {
		return fmt.Errorf("seal dpop key: %w", err)
	}
	if err := db.Exec(`INSERT INTO tokenguard_dpop_keys (connection_id, jkt, private_key) VALUES (?, ?, ?)
ON CONFLICT (connection_id, jkt) DO UPDATE SET private_key = EXCLUDED.private_key`, id, jkt, sealedKey).Error; err != nil {
		return storeError(ctx, "store dpop key", err)
	}
	return storeError(ctx, "bind grant to dpop key",
		db.Exec(`UPDATE tokenguard_tokens SET dpop_jkt = ? WHERE connection_id = ?`, jkt, id).Error)
}

// dpopKeys caches opened DPoP keys by connection id and thumbprint: a key
// never changes for its thumbprint, so each process reads it once.
type dpopKeys struct{ m sync.Map }

// DPoPKey returns the private key (PEM) connection's grant is bound to,
// whose thumbprint is jkt: domain.ErrNotFound when there is none (the grant
// was replaced meanwhile), domain.ErrUndecryptable when it cannot be
// opened.
func (r *TokenRepository) DPoPKey(ctx context.Context, connection, jkt string) (domain.Secret, error) {
	id, err := r.ids.lookup(ctx, r.db, connection)
	if err != nil {
		return domain.Secret{}, err
	}
	cacheKey := strconv.FormatInt(int64(id), 10) + "/" + jkt
	if v, ok := r.keys.m.Load(cacheKey); ok {
		return v.(domain.Secret), nil
	}
	var stored []string
	if err := r.db.WithContext(ctx).Raw(`SELECT private_key FROM tokenguard_dpop_keys WHERE connection_id = ? AND jkt = ?`, id, jkt).
		Find(&stored).Error; err != nil {
		return domain.Secret{}, storeError(ctx, "read dpop key", err)
	}
	if len(stored) == 0 {
		return domain.Secret{}, fmt.Errorf("dpop key %s of %s: %w", jkt, connection, domain.ErrNotFound)
	}
	pem, err := r.sealer.Open(stored[0], dpopAAD(id, jkt))
	if err != nil {
		return domain.Secret{}, fmt.Errorf("dpop key of %s: %w", connection, err)
	}
	key := domain.NewSecret(pem)
	r.keys.m.Store(cacheKey, key)
	return key, nil
}

// resealDPoPKeys seals every stored DPoP key again with the current key
// (tokenctl rotate-key), each under its connection's lock.
func (r *TokenRepository) resealDPoPKeys(ctx context.Context, wait time.Duration) (int, error) {
	var rows []struct {
		ID         int32
		Name       string
		JKT        string `gorm:"column:jkt"`
		PrivateKey string
	}
	if err := r.db.WithContext(ctx).Raw(`SELECT k.connection_id AS id, c.name, k.jkt, k.private_key
FROM tokenguard_dpop_keys k JOIN tokenguard_connections c ON c.id = k.connection_id ORDER BY k.connection_id`).
		Find(&rows).Error; err != nil {
		return 0, storeError(ctx, "read dpop keys", err)
	}
	n := 0
	for _, row := range rows {
		if r.sealer.IsCurrent(row.PrivateKey) {
			continue
		}
		err := r.inLock(ctx, row.Name, wait, resealHold, func(ctx context.Context, tx *gorm.DB) error {
			pem, err := r.sealer.Open(row.PrivateKey, dpopAAD(row.ID, row.JKT))
			if err != nil {
				return fmt.Errorf("dpop key of %s: %w", row.Name, err)
			}
			again, err := r.sealer.Seal(pem, dpopAAD(row.ID, row.JKT))
			if err != nil {
				return err
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
