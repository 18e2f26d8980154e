package repository

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// nsInSchema keeps two deployments in one database apart: in the public schema a lock namespace
// is the fixed one, placeholder p (as earlier releases, so old and new processes meet during a
// rolling deploy); in any other schema it is derived from the schema's name.
func nsInSchema(p string) string {
	return "(CASE current_schema() WHEN 'public' THEN " + p + "::int4 ELSE hashtext('tokenguard:' || current_schema()) END)"
}

// channelInSchema is nsInSchema for a NOTIFY channel; ChannelFor in Go.
func channelInSchema(p string) string {
	return "(CASE current_schema() WHEN 'public' THEN " + p + "::text ELSE " + p + "::text || '_' || left(md5(current_schema()), 16) END)"
}

// ChannelFor is the change channel of tokenguard's tables in schema.
func ChannelFor(schema string) string {
	if schema == "public" || schema == "" {
		return ChangeChannel
	}
	sum := md5.Sum([]byte(schema))
	return ChangeChannel + "_" + hex.EncodeToString(sum[:])[:16]
}

// lockNamespace ('tkgd') is the first half of every connection lock key, in the two-int4 form:
// libraries that lock with a single int8 (golang-migrate) cannot collide with it. The second
// half is the connection's id, unique per name (unlike a hash), given at Register.
const lockNamespace int32 = 0x746b6764

// lockSettings are a locked transaction's settings: lock_timeout, synchronous_commit, and generic
// plans: its statements touch single rows by key, so the generic plan is the custom one, made
// once per connection instead of at each of the first five runs (docs/benchmarks.md).
type lockSettings struct{ timeout, syncCommit string }

// settingsSQL sets them; an empty value leaves its setting as it is.
const settingsSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       CASE WHEN ?::text <> '' THEN set_config('lock_timeout', ?::text, true) END,
       CASE WHEN ?::text <> '' THEN set_config('synchronous_commit', ?::text, true) END`

func (s lockSettings) args() []any { return []any{s.timeout, s.timeout, s.syncCommit, s.syncCommit} }

// lockConnectionByName takes one connection's lock, resolving its key and applying the settings
// (scanned first) in the same statement; an unregistered name is domain.ErrNotFound.
func lockConnectionByName(tx *gorm.DB, name string, set lockSettings) error {
	var rows []struct{ Locked string }
	err := tx.Raw(`WITH s AS MATERIALIZED (`+settingsSQL+`)
SELECT pg_advisory_xact_lock(`+nsInSchema("?")+`, c.id)::text AS locked FROM s, tokenguard_connections c WHERE c.name = ?`,
		append(set.args(), lockNamespace, name)...).Find(&rows).Error
	if err == nil && len(rows) != 1 {
		err = fmt.Errorf("lock %s: %w", name, domain.ErrNotFound)
	}
	return err
}

// lockConnectionsByName locks in ascending key order, so overlapping sets cannot deadlock.
func lockConnectionsByName(tx *gorm.DB, ids []string, set lockSettings) error {
	var keys []int32
	if err := tx.Raw("SELECT id FROM tokenguard_connections WHERE name IN ? ORDER BY id", ids).Find(&keys).Error; err != nil {
		return err
	}
	if len(keys) != len(ids) {
		return fmt.Errorf("lock %d connection(s), %d registered: %w", len(ids), len(keys), domain.ErrNotFound)
	}
	if err := tx.Exec("SELECT true FROM ("+settingsSQL+") s", set.args()...).Error; err != nil {
		return err
	}
	for _, k := range keys {
		if err := tx.Exec("SELECT pg_advisory_xact_lock("+nsInSchema("?")+", ?)", lockNamespace, k).Error; err != nil {
			return fmt.Errorf("lock connection key %d: %w", k, err)
		}
	}
	return nil
}
