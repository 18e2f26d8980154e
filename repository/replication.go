package repository

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/tokenguard/tokenguard/domain"
)

// Replication is what the primary says about its standbys: whether a failover can lose a commit.
type Replication struct {
	SyncStandbyNames string // the primary's synchronous_standby_names ("": none)
	// Standbys stream from it, SyncStandbys of them are waited for (sync or quorum), and Hidden
	// are those whose state this role may not see (it needs pg_read_all_stats, as pg_monitor has).
	Standbys, SyncStandbys, Hidden int
}

// Synchronous reports whether a commit waits for a standby, which a failover then promotes.
func (r Replication) Synchronous() bool { return r.SyncStandbyNames != "" && r.SyncStandbys > 0 }

// Loss says, in one sentence for operators, what a failover can lose.
func (r Replication) Loss() string {
	switch {
	case r.Synchronous():
		return "a failover to a synchronous standby loses no committed token write"
	case r.Hidden > 0:
		return "the database role may not see whether its standbys are synchronous (grant it pg_monitor): a failover may lose token writes"
	case r.SyncStandbyNames != "":
		return "synchronous_standby_names is set but no synchronous standby is connected: commits wait for one to come back; a failover now can lose token writes"
	case r.Standbys > 0:
		return "standbys are asynchronous: a failover can lose the last token writes, and a rotated refresh token lost is a grant the provider revokes at the next refresh"
	}
	return "no standby: a failover or a restore from backup can lose token writes"
}

// DefaultSyncCommit is the token writes' synchronous_commit when none is configured: remote_apply
// with a synchronous standby (a success means the standby has applied the token), else on.
func (r Replication) DefaultSyncCommit() string {
	if r.Synchronous() {
		return "remote_apply"
	}
	return "on"
}

// ParseSyncCommit checks a synchronous_commit level ("": the cluster's default).
func ParseSyncCommit(level string) (string, error) {
	if level == "" || slices.Contains([]string{"off", "local", "remote_write", "on", "remote_apply"}, level) {
		return level, nil
	}
	return "", fmt.Errorf("%w: %q (want off, local, remote_write, on or remote_apply)", domain.ErrInvalidSyncCommit, level)
}

// ReadReplication asks the database about its standbys (none on a non-primary, which CheckPrimary refuses).
func (r *TokenRepository) ReadReplication(ctx context.Context) (Replication, error) {
	// Without pg_read_all_stats a role sees only the pid of each standby.
	return scan[Replication](ctx, r.db, "read replication state", `SELECT current_setting('synchronous_standby_names') AS sync_standby_names,
       count(s.pid)::int AS standbys,
       count(s.pid) FILTER (WHERE s.sync_state IN ('sync', 'quorum'))::int AS sync_standbys,
       count(s.pid) FILTER (WHERE s.sync_state IS NULL)::int AS hidden
FROM (SELECT 1) one LEFT JOIN pg_stat_replication s ON true`)
}

// Durability holds the synchronous_commit level of the token writes and refresh claims: the
// configured one, else the cluster's default as last read. It is safe for concurrent use.
type Durability struct {
	configured string
	last       atomic.Pointer[Replication]
}

// NewDurability holds level ("": the cluster's default), which ParseSyncCommit checks.
func NewDurability(level string) (*Durability, error) {
	level, err := ParseSyncCommit(level)
	if err != nil {
		return nil, err
	}
	return &Durability{configured: level}, nil
}

// Observe records the cluster as just read.
func (d *Durability) Observe(r Replication) { d.last.Store(&r) }

// Replication is the cluster as last read, and whether it was read.
func (d *Durability) Replication() (Replication, bool) {
	if r := d.last.Load(); r != nil {
		return *r, true
	}
	return Replication{}, false
}

// SyncCommit is the token writes' level: the configured one, else the cluster's DefaultSyncCommit, else on.
func (d *Durability) SyncCommit() string {
	r, _ := d.Replication() // unread: the zero Replication's "on"
	return cmp.Or(d.configured, r.DefaultSyncCommit())
}

// SetDurability makes token writes and refresh claims commit at d's level; call it before use.
func (r *TokenRepository) SetDurability(d *Durability) { r.durability = d }

// Durability is what SetDurability set (nil: none).
func (r *TokenRepository) Durability() *Durability { return r.durability }

// CheckPrimary fails with domain.ErrReadOnlyStore on a replica, so that a process fails at start-up.
func (r *TokenRepository) CheckPrimary(ctx context.Context) error {
	recovering, err := scan[bool](ctx, r.db, "check the database is a primary", "SELECT pg_is_in_recovery()")
	if err != nil {
		return err
	}
	if recovering {
		return fmt.Errorf("%w: pg_is_in_recovery() is true, and every refresh must be stored: connect to the primary", domain.ErrReadOnlyStore)
	}
	return nil
}
