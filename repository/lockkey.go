package repository

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// nsInSchema keeps two deployments in one database apart: in the public
// schema a lock namespace or NOTIFY channel is the fixed one (what every
// earlier release used, so old and new processes meet during a rolling
// deploy); in any other schema (the tables' schema, current_schema()) it is
// derived from the schema's name. p is the placeholder of the fixed value.
func nsInSchema(p string) string {
	return "(CASE current_schema() WHEN 'public' THEN " + p + "::int4 ELSE hashtext('tokenguard:' || current_schema()) END)"
}

// channelInSchema is ChangeChannel as nsInSchema decides it; ChannelFor is
// the same in Go.
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

// lockNamespace is the first half of every connection lock key, in the
// two-int4 form of pg_advisory_xact_lock. That form is a key space of its
// own: golang-migrate and other libraries that lock with a single int8
// cannot collide with us. ('t','k','g','d' as bytes.)
const lockNamespace int32 = 0x746b6764

// The second half is tokenguard_connections.id, an identity column. It is unique per
// connection name by construction, so unlike hashtext(name) (which collides
// within ~100k keys) two connections never share a lock. A name gets its id
// when it is registered, before it has any token, so a lock can be taken
// for a connection that is only being created.

// lockConnections takes the transaction-scoped advisory locks of keys on
// tx's own connection. With the statements below it is the only place that
// takes these locks, and it always locks in ascending key order without
// duplicates, so two transactions that need overlapping sets of
// connections cannot deadlock. (The statements below lock one connection
// each, so they have no order to keep.)
func lockConnections(tx *gorm.DB, keys []int32) error {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, k := range keys {
		if err := tx.Exec("SELECT pg_advisory_xact_lock("+nsInSchema("?")+", ?)", lockNamespace, k).Error; err != nil {
			return fmt.Errorf("lock connection key %d: %w", k, err)
		}
	}
	return nil
}

// lockSettings are a locked transaction's settings: the lock wait's bound
// (lock_timeout), synchronous_commit (Durability), and generic plans. Its
// statements read and write single rows by key, so the generic plan is
// the custom one, made once per pool connection instead of at each of its
// first five runs of a statement (docs/benchmarks.md: the storm's p50 and
// p99 1.07-1.18x the protocol floor's without it, 1.02-1.07x with it).
type lockSettings struct{ timeout, syncCommit string }

// settingsSQL sets them; an empty value leaves its setting as it is.
const settingsSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       CASE WHEN ?::text <> '' THEN set_config('lock_timeout', ?::text, true) END,
       CASE WHEN ?::text <> '' THEN set_config('synchronous_commit', ?::text, true) END`

func (s lockSettings) args() []any { return []any{s.timeout, s.timeout, s.syncCommit, s.syncCommit} }

// lockConnectionByName takes one connection's lock, resolving its key and
// giving the transaction its settings in the same statement: the
// settings' CTE is scanned before any row reaches the lock. found is false
// for an unregistered name.
func lockConnectionByName(tx *gorm.DB, name string, set lockSettings) (found bool, err error) {
	var rows []struct{ Locked string }
	err = tx.Raw(`WITH s AS MATERIALIZED (`+settingsSQL+`)
SELECT pg_advisory_xact_lock(`+nsInSchema("?")+`, c.id)::text AS locked FROM s, tokenguard_connections c WHERE c.name = ?`,
		append(set.args(), lockNamespace, name)...).Find(&rows).Error
	return len(rows) == 1, err
}
