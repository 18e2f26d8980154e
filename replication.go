package tokenguard

import (
	"context"
	"log/slog"
	"time"
)

// observeReplication records whether the primary has a synchronous standby, for the token
// writes' synchronous_commit, and logs what a failover can lose when that changes; New's first
// reading of a lone server is returned instead, for its one INFO line.
func (t *Tokens) observeReplication(ctx context.Context, first bool) (lone string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := t.repo.ReadReplication(ctx)
	if err != nil {
		t.o.Logger.Warn("tokenguard: cannot read the replication state; the token writes keep their synchronous_commit level", "err", err)
		return ""
	}
	d := t.repo.Durability()
	before, known := d.Replication()
	d.Observe(r)
	if t.metrics != nil {
		t.metrics.ReplicationSync(r.Synchronous())
	}
	if known && before.Synchronous() == r.Synchronous() && before.SyncStandbyNames == r.SyncStandbyNames {
		return ""
	}
	// Warn of standbys a failover can promote without the last commits.
	level := slog.LevelInfo
	if !r.Synchronous() && (r.Standbys > 0 || r.SyncStandbyNames != "" || r.Hidden > 0) {
		level = slog.LevelWarn
	}
	if first && level == slog.LevelInfo && !r.Synchronous() {
		return r.Loss()
	}
	t.o.Logger.Log(ctx, level, "tokenguard: "+r.Loss(),
		slog.Int("standbys", r.Standbys), slog.Int("synchronous_standbys", r.SyncStandbys), slog.Int("hidden_standbys", r.Hidden),
		slog.String("synchronous_standby_names", r.SyncStandbyNames),
		slog.String("token_synchronous_commit", d.SyncCommit()))
	return ""
}

// writtenBack: the database lost a rotation this process stored, and it is stored again.
func (t *Tokens) writtenBack(connection string, lost, found, stored int64) {
	t.o.Logger.Warn("tokenguard: a rotation the database lost (a failover to an asynchronous standby, a restore) is stored again; its spent refresh token is never presented",
		"connection", connection, "lost_version", lost, "found_version", found, "stored_version", stored)
}

// rolledBack: connection is stored behind a version known committed.
func (t *Tokens) rolledBack(connection string, known, stored int64) {
	if t.metrics != nil {
		t.metrics.VersionRegressed()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.repo.RecordRollback(ctx, connection, known, stored); err != nil {
		t.o.Logger.Warn("tokenguard: connection.rolled_back event not queued", "connection", connection, "err", err)
	}
}
