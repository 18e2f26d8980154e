package di_test

import (
	"cmp"
	"context"
	"testing"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
)

// The operator tools' locked writes (an import's grant, a reactivation)
// commit as durably as the apps' do: at TOKEN_SYNC_COMMIT, else at the
// cluster's default.
func TestOperatorStoreCommitsAsTheApps(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	ctx := context.Background()
	url := testdb.New(t)
	for level, want := range map[string]string{"": "on", "remote_write": "remote_write", "off": "off"} {
		cfg := configWith(t, url, "")
		cfg.SyncCommit = level
		s, cleanup, err := di.NewStore(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := s.Repository.Durability()
		if d == nil {
			t.Fatalf("TOKEN_SYNC_COMMIT=%q: the tools' writes commit at the server's own synchronous_commit", level)
		}
		if got := d.SyncCommit(); got != want {
			t.Errorf("TOKEN_SYNC_COMMIT=%q: the tools' writes commit at %q, want %q", level, got, want)
		}
		if _, ok := d.Replication(); !ok {
			t.Errorf("TOKEN_SYNC_COMMIT=%q: the cluster's replication was not read", level)
		}
		// Unset, the level follows the cluster: with a synchronous standby, remote_apply.
		d.Observe(repository.Replication{SyncStandbyNames: "standby", SyncStandbys: 1})
		if got, want := d.SyncCommit(), cmp.Or(level, "remote_apply"); got != want {
			t.Errorf("TOKEN_SYNC_COMMIT=%q, a synchronous standby: the tools' writes commit at %q, want %q", level, got, want)
		}
		cleanup()
	}
}
