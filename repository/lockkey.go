package repository

import (
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// lockNamespace is the first half of every connection lock key, in the
// two-int4 form of pg_advisory_xact_lock. That form is a key space of its
// own: golang-migrate and other libraries that lock with a single int8
// cannot collide with us. ('t','k','g','d' as bytes.)
const lockNamespace int32 = 0x746b6764

// The second half is connections.id, an identity column. It is unique per
// connection name by construction, so unlike hashtext(name) (which collides
// within ~100k keys) two connections never share a lock. A name gets its id
// when it is registered, before it has any token, so a lock can be taken
// for a connection that is only being created.

// lockConnections takes the transaction-scoped advisory locks of keys on
// tx's own connection. It is the only place that calls pg_advisory_xact_lock,
// and it always locks in ascending key order without duplicates, so two
// transactions that need overlapping sets of connections cannot deadlock.
func lockConnections(tx *gorm.DB, keys []int32) error {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, k := range keys {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?, ?)", lockNamespace, k).Error; err != nil {
			return fmt.Errorf("lock connection key %d: %w", k, err)
		}
	}
	return nil
}

// lockConnectionByName takes one connection's lock, resolving its key in
// the same statement (one round trip on the refresh path). found is false
// for an unregistered name.
func lockConnectionByName(tx *gorm.DB, name string) (found bool, err error) {
	var rows []struct{ Locked string }
	err = tx.Raw("SELECT pg_advisory_xact_lock(?, id)::text AS locked FROM connections WHERE name = ?", lockNamespace, name).Find(&rows).Error
	return len(rows) == 1, err
}

// tryLockConnectionByName is the non-waiting variant, for sweeps that
// should skip a connection another process is refreshing rather than queue
// behind it.
func tryLockConnectionByName(tx *gorm.DB, name string) (found, locked bool, err error) {
	var rows []bool
	err = tx.Raw("SELECT pg_try_advisory_xact_lock(?, id) FROM connections WHERE name = ?", lockNamespace, name).Find(&rows).Error
	return len(rows) == 1, len(rows) == 1 && rows[0], err
}
