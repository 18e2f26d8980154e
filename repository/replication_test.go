package repository_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/repository"
)

func TestSyncCommitLevels(t *testing.T) {
	for _, l := range []string{"", "off", "local", "remote_write", "on", "remote_apply"} {
		if _, err := repository.NewDurability(l); err != nil {
			t.Errorf("%q refused: %v", l, err)
		}
	}
	for _, l := range []string{"always", "ON", "remote apply", "1"} {
		if _, err := repository.NewDurability(l); !errors.Is(err, domain.ErrInvalidSyncCommit) {
			t.Errorf("%q: err = %v, want ErrInvalidSyncCommit", l, err)
		}
	}
	d, _ := repository.NewDurability("")
	if got := d.SyncCommit(); got != "on" {
		t.Errorf("default before the cluster is read = %q, want on", got)
	}
	d.Observe(repository.Replication{SyncStandbyNames: "*", Standbys: 1, SyncStandbys: 1})
	if got := d.SyncCommit(); got != "remote_apply" {
		t.Errorf("default with a synchronous standby = %q, want remote_apply", got)
	}
	// Configured wins; a synchronous_standby_names with nobody connected
	// is no synchronous standby.
	d, _ = repository.NewDurability("local")
	d.Observe(repository.Replication{SyncStandbyNames: "*", Standbys: 1, SyncStandbys: 1})
	if got := d.SyncCommit(); got != "local" {
		t.Errorf("configured local = %q", got)
	}
	if (repository.Replication{SyncStandbyNames: "*"}).Synchronous() {
		t.Error("synchronous without a standby connected")
	}
}

// The replication state as a primary reports it: none on a lone server,
// an asynchronous and a synchronous standby on a throw-away pair.
func TestReadReplication(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	got, err := r.ReadReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Synchronous() || got.DefaultSyncCommit() != "on" {
		t.Errorf("lone server: %v, synchronous %v", got, got.Synchronous())
	}
	for _, sync := range []bool{false, true} {
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		pair, err := pgserver.StartPair(startCtx, sync)
		cancel()
		if err != nil {
			t.Skipf("no throw-away primary and standby: %v", err)
		}
		t.Cleanup(pair.Close)
		got, err := repository.NewTokenRepository(open(t, pair.PrimaryURL()), tokencrypt.Plaintext{}).ReadReplication(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: "on", true: "remote_apply"}[sync]
		if got.Standbys != 1 || got.Synchronous() != sync || got.DefaultSyncCommit() != want {
			t.Errorf("pair (sync %v): %v, synchronous %v, default %s", sync, got, got.Synchronous(), got.DefaultSyncCommit())
		}
		t.Log(got.Loss())
		if !sync {
			continue
		}
		// A role without pg_read_all_stats sees the standby's pid only:
		// tokenguard says it cannot tell, and keeps the default on.
		if err := open(t, pair.PrimaryURL()).Exec("CREATE ROLE app LOGIN").Error; err != nil {
			t.Fatal(err)
		}
		got, err = repository.NewTokenRepository(open(t, strings.Replace(pair.PrimaryURL(), "postgres@", "app@", 1)), tokencrypt.Plaintext{}).ReadReplication(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Hidden != 1 || got.Synchronous() || got.DefaultSyncCommit() != "on" || !strings.Contains(got.Loss(), "pg_monitor") {
			t.Errorf("unprivileged role: %v, %s", got, got.Loss())
		}
	}
}
