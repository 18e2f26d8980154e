package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testOperations covers the operator paths: the batch's refresh-ahead sweep
// and turning encryption on with tokenctl rotate-key, as processes.
func testOperations(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: time.Second})
	s.migrate()
	for _, name := range []string{"a", "b", "c"} {
		s.importGrant(name)
	}

	// Every token expires within 2h: one sweep refreshes all three, then
	// the round's calls use the refreshed tokens.
	r := run(t, bin, "batch", s.env, "", "--refresh-ahead", "2h", "--refresh-concurrency", "2")
	if r.code != 0 {
		t.Fatalf("batch --refresh-ahead: exit %d\n%s", r.code, r.stderr)
	}
	var round struct {
		Calls, Succeeded int
		AheadDue         int `json:"ahead_due"`
		AheadRefreshed   int `json:"ahead_refreshed"`
		AheadBusy        int `json:"ahead_skipped_busy"`
		AheadFailed      int `json:"ahead_failed"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &round); err != nil {
		t.Fatalf("batch output %q: %v", r.stdout, err)
	}
	st := s.sb.Stats()
	t.Logf("refresh-ahead round: %+v; provider: %d refreshes, %d reuse", round, st.Refreshes, st.RefreshReuse)
	if round.AheadDue != 3 || round.AheadRefreshed != 3 || round.Succeeded != 3 || st.Refreshes != 3 || st.RefreshReuse != 0 {
		t.Errorf("want 3 due, 3 refreshed, 3 calls ok and 3 provider refreshes")
	}
	// A window nothing falls into refreshes nothing.
	if r := run(t, bin, "batch", s.env, "", "--refresh-ahead", "1m"); r.code != 0 || s.sb.Stats().Refreshes != 3 {
		t.Errorf("second sweep: exit %d, provider refreshes %d", r.code, s.sb.Stats().Refreshes)
	}

	// Keep-alive: only the connection not refreshed for 40 days is.
	db, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(context.Background(), `UPDATE tokenguard_tokens SET obtained_at = now() - interval '40 days'
		WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'b')`); err != nil {
		t.Fatal(err)
	}
	r = run(t, bin, "batch", s.env, "", "--keep-alive", "720h")
	var kept struct {
		Due       int `json:"keepalive_due"`
		Refreshed int `json:"keepalive_refreshed"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &kept); r.code != 0 || err != nil {
		t.Fatalf("batch --keep-alive: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if st := s.sb.Stats(); kept.Due != 1 || kept.Refreshed != 1 || st.Refreshes != 4 || st.RefreshReuse != 0 {
		t.Errorf("keep-alive round %+v, provider refreshes %d, reuse %d: want the idle connection refreshed, alone", kept, st.Refreshes, st.RefreshReuse)
	}

	// Turn encryption on: rotate-key needs the key, seals every row, and
	// the apps keep working with the key set.
	if r := run(t, bin, "tokenctl", s.env, "", "rotate-key"); r.code != 2 || !strings.Contains(r.stderr, "TOKEN_ENCRYPTION_KEYS") {
		t.Errorf("rotate-key without keys: exit %d %q", r.code, r.stderr)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyed := append(s.env, "TOKEN_ENCRYPTION_KEYS=k1="+base64.StdEncoding.EncodeToString(key)+"*")
	r = run(t, bin, "tokenctl", keyed, "", "rotate-key")
	if r.code != 0 || !strings.Contains(r.stdout, "re-encrypted 3 connection(s)") {
		t.Fatalf("rotate-key: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var plain int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM tokenguard_tokens WHERE access_token NOT LIKE 'tg1:k1:%' OR refresh_token NOT LIKE 'tg1:k1:%'").Scan(&plain); err != nil || plain != 0 {
		t.Errorf("%d rows not sealed with k1 (%v)", plain, err)
	}
	if r := run(t, bin, "batch", keyed, ""); r.code != 0 {
		t.Errorf("batch with the key: exit %d\n%s", r.code, r.stderr)
	}
	// Without the key the apps refuse to start rather than send garbage.
	if r := run(t, bin, "batch", s.env, ""); r.code == 0 || !strings.Contains(r.stderr, "TOKEN_ENCRYPTION_KEYS") {
		t.Errorf("batch without the key: exit %d %q", r.code, r.stderr)
	}
}
