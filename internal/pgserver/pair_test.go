//go:build unix

package pgserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A commit made while the primary is cut off from its standby: with an
// asynchronous standby it is acknowledged and then lost by the failover
// (the loss the failover soak makes happen); with a synchronous one it is
// never acknowledged, and everything acknowledged before is kept.
func TestPairFailoverLosesOnlyWhatTheStandbyMayLose(t *testing.T) {
	needBinaries(t)
	for _, sync := range []bool{false, true} {
		name := map[bool]string{false: "async", true: "sync"}[sync]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			p, err := StartPair(ctx, sync)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := execSQL(ctx, p.URL("postgres"), "CREATE TABLE acks (n int)", "INSERT INTO acks VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			for n := 0; n == 0; time.Sleep(20 * time.Millisecond) { // the standby has it
				_ = query(ctx, p.StandbyURL(), func(c *pgx.Conn) error {
					return c.QueryRow(ctx, "SELECT count(*) FROM acks").Scan(&n)
				})
			}
			failed := make(chan error, 1)
			go func() {
				_, err := p.Failover(ctx, 2*time.Second, nil)
				failed <- err
			}()
			time.Sleep(500 * time.Millisecond) // cut off, still running
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			acked := execSQL(ictx, p.nodes[0].url("postgres"), "INSERT INTO acks VALUES (2)") == nil
			cancel()
			if err := <-failed; err != nil {
				t.Fatal(err)
			}
			var rows []int
			err = query(ctx, p.URL("postgres"), func(c *pgx.Conn) error {
				r, err := c.Query(ctx, "SELECT n FROM acks ORDER BY n")
				if err != nil {
					return err
				}
				rows, err = pgx.CollectRows(r, pgx.RowTo[int])
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 || rows[0] != 1 {
				t.Fatalf("rows after the failover = %v: the commit made before the cut is lost", rows)
			}
			switch {
			case sync && acked:
				t.Errorf("a commit was acknowledged without the synchronous standby")
			case !sync && (!acked || len(rows) != 1):
				t.Errorf("asynchronous: acknowledged %v, rows after the failover %v; want acknowledged and lost", acked, rows)
			}
			if p.PrimaryURL() != p.nodes[1].url("postgres") {
				t.Error("the standby was not promoted")
			}
		})
	}
}

// A lone server is the pair's primary without the standby: the same
// settings, nothing streaming from it, writes acknowledged alone.
func TestStartLoneIsThePairsPrimaryAlone(t *testing.T) {
	needBinaries(t)
	ctx := context.Background()
	s, err := StartLone(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var fsync, walLevel, names string
	var standbys int
	err = query(ctx, s.URL, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('wal_level'), current_setting('synchronous_standby_names'),
			(SELECT count(*) FROM pg_stat_replication)`).Scan(&fsync, &walLevel, &names, &standbys)
	})
	if err != nil {
		t.Fatal(err)
	}
	if fsync != "off" || walLevel != "replica" || names != "" || standbys != 0 {
		t.Errorf("fsync %s, wal_level %s, synchronous_standby_names %q, %d standbys; want the pair's primary's settings and no standby", fsync, walLevel, names, standbys)
	}
	if err := execSQL(ctx, s.URL, "CREATE TABLE t (n int)", "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := Ping(ctx, s.URL, time.Second); err == nil {
		t.Error("the server still answers after Close")
	}
}

// A node whose port another process took after newNode found it free
// starts on another port (parallel test packages bind ephemeral ports).
func TestPairNodeStartsElsewhereWhenItsPortIsTaken(t *testing.T) {
	needBinaries(t)
	ctx := context.Background()
	p, err := startPrimary(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	n, err := p.newNode(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p.nodes[1] = n // Close stops it
	if err := p.run(ctx, "initdb", "-D", n.data(), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	taken := n.port
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", taken))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := p.start(ctx, n); err != nil {
		t.Fatalf("start with port %d taken: %v", taken, err)
	}
	if n.port == taken {
		t.Fatalf("started on the taken port %d", taken)
	}
	if err := execSQL(ctx, n.url("postgres"), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}
