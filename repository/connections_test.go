package repository_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

func metadata(t *testing.T, object string, tags ...string) *domain.Metadata {
	t.Helper()
	m, err := domain.NewMetadata([]byte(object), tags)
	if err != nil {
		t.Fatal(err)
	}
	return &m
}

func connection(t *testing.T, r *repository.TokenRepository, name string) domain.Connection {
	t.Helper()
	c, err := r.Connection(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func wantMetadata(t *testing.T, r *repository.TokenRepository, name, object string, tags ...string) {
	t.Helper()
	c := connection(t, r, name)
	if string(c.Metadata.Object) != object || !slices.Equal(c.Metadata.Tags, tags) {
		t.Errorf("%s: metadata %s tags %q, want %s %q", name, c.Metadata.Object, c.Metadata.Tags, object, tags)
	}
}

// Metadata is stored with a grant and survives every token write that
// does not give new metadata: a refresh's Save (the statement an older
// process runs too, which names its columns), a Put of a new grant
// without metadata (an older process's reconnection), a reactivation. A
// grant refused for another account leaves it as it was.
func TestMetadataSurvivesTokenWrites(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	connect := usecase.NewConnectUseCase(r, nil, time.Second)
	g := domain.Grant{AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1"), Expiry: time.Now().Add(time.Hour)}

	if _, err := connect.ConnectGrant(ctx, "acme", g, usecase.ConnectRequest{Binding: domain.Binding{Account: "u1"},
		Metadata: metadata(t, `{"tenant": "t1", "user": 7}`, "crm", "eu")}); err != nil {
		t.Fatal(err)
	}
	wantMetadata(t, r, "acme", `{"user":7,"tenant":"t1"}`, "crm", "eu")

	// A refresh (Store, unchanged: what every process runs).
	tok, err := r.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store(ctx, tok.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now())); err != nil {
		t.Fatal(err)
	}
	wantMetadata(t, r, "acme", `{"user":7,"tenant":"t1"}`, "crm", "eu")

	// A grant from another account, not allowed: nothing changes.
	_, err = connect.ConnectGrant(ctx, "acme", g, usecase.ConnectRequest{Binding: domain.Binding{Account: "u2"},
		Metadata: metadata(t, `{"tenant":"t2"}`)})
	if !errors.Is(err, domain.ErrAccountMismatch) {
		t.Fatalf("grant of another account: %v", err)
	}
	wantMetadata(t, r, "acme", `{"user":7,"tenant":"t1"}`, "crm", "eu")

	// A new grant without metadata (Put, as an older process stores one).
	put(t, r, grantToken("acme", "at-3", "rt-3"))
	wantMetadata(t, r, "acme", `{"user":7,"tenant":"t1"}`, "crm", "eu")

	// New metadata with a new grant replaces it.
	if _, err := connect.ConnectGrant(ctx, "acme", g, usecase.ConnectRequest{AllowAccountChange: true, Metadata: metadata(t, `{"tenant":"t3"}`)}); err != nil {
		t.Fatal(err)
	}
	wantMetadata(t, r, "acme", `{"tenant":"t3"}`)
}

// The database refuses what NewMetadata would: an array, too many tags.
func TestDatabaseRefusesMalformedMetadata(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at", "rt"))
	for _, stmt := range []string{
		`UPDATE tokenguard_connections SET metadata = '[1]' WHERE name = 'acme'`,
		`UPDATE tokenguard_connections SET tags = (SELECT array_agg(i::text) FROM generate_series(1, 33) i) WHERE name = 'acme'`,
	} {
		if err := db.Exec(stmt).Error; err == nil {
			t.Errorf("%s: accepted", stmt)
		}
	}
	wantMetadata(t, r, "acme", `{}`)
}

// ConnectionsPage walks every connection with a token once, in name order,
// a keyset page at a time.
func TestConnectionsPage(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("c%02d", i)
		want = append(want, name)
		put(t, r, grantToken(name, "at", "rt"))
	}
	if err := r.Register(ctx, "registered-only"); err != nil { // no token: not listed
		t.Fatal(err)
	}
	var got []string
	for after := ""; ; {
		page, err := r.ConnectionsPage(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range page {
			got = append(got, c.Name)
			if c.Status != domain.StatusActive || c.Version != 1 || string(c.Metadata.Object) != "{}" || c.Metadata.Tags != nil {
				t.Errorf("%+v", c)
			}
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].Name
	}
	if !slices.Equal(got, want) {
		t.Errorf("pages walked %v, want %v", got, want)
	}
}

// Disconnect deletes the token, resets the metadata, announces
// "<version+1> <name>" in its commit and queues a webhook event; a later
// grant of the same name continues above the announced version, even when
// an older process stores it (the trigger sets the version).
func TestDisconnect(t *testing.T) {
	r, db, url := newRepo(t)
	ctx := context.Background()
	connect := usecase.NewConnectUseCase(r, nil, time.Second)
	g := domain.Grant{AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1")}
	if _, err := connect.ConnectGrant(ctx, "acme", g, usecase.ConnectRequest{Metadata: metadata(t, `{"tenant":"t1"}`, "crm")}); err != nil {
		t.Fatal(err)
	}
	var connected string
	if err := db.Raw(`SELECT data::text FROM tokenguard_webhook_outbox WHERE type = 'connection.connected' ORDER BY id LIMIT 1`).Scan(&connected).Error; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(connected, `"metadata": {"tenant": "t1"}`) || !strings.Contains(connected, `"tags": ["crm"]`) {
		t.Errorf("connection.connected event data %s: want the metadata and tags stored with the grant", connected)
	}
	put(t, r, grantToken("acme", "at-2", "rt-2")) // version 2

	listen, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(ctx)
	if _, err := listen.Exec(ctx, "LISTEN "+repository.ChangeChannel); err != nil {
		t.Fatal(err)
	}

	var seen domain.Token
	refuse := errors.New("provider down")
	if _, err := r.Disconnect(ctx, "acme", time.Second, func(_ context.Context, tok domain.Token) (bool, error) {
		seen = tok
		return false, refuse
	}); !errors.Is(err, refuse) {
		t.Fatalf("disconnect whose revocation failed: %v", err)
	}
	if seen.RefreshToken.Reveal() != "rt-2" {
		t.Errorf("revocation saw refresh token %q, want the current one", seen.RefreshToken.Reveal())
	}
	wantMetadata(t, r, "acme", `{"tenant":"t1"}`, "crm") // kept, token and all

	deleted, err := r.Disconnect(ctx, "acme", time.Second, func(context.Context, domain.Token) (bool, error) { return true, nil })
	if err != nil || deleted.Version != 2 {
		t.Fatalf("disconnect: %v, %+v", err, deleted)
	}
	if _, err := r.Get(ctx, "acme"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("token after disconnect: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listen.WaitForNotification(wctx)
	if err != nil || n.Payload != "3 acme" {
		t.Fatalf("announcement %v, %v; want 3 acme", n, err)
	}
	var event struct {
		Type string
		Data string
	}
	if err := db.Raw(`SELECT type, data::text AS data FROM tokenguard_webhook_outbox ORDER BY id DESC LIMIT 1`).Scan(&event).Error; err != nil {
		t.Fatal(err)
	}
	var data map[string]any
	if event.Type != "connection.disconnected" || json.Unmarshal([]byte(event.Data), &data) != nil ||
		data["revoked"] != true || data["version"] != float64(3) || fmt.Sprint(data["metadata"]) != "map[tenant:t1]" {
		t.Errorf("webhook event %+v", event)
	}
	if _, err := r.Disconnect(ctx, "acme", time.Second, nil); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("second disconnect: %v", err)
	}

	// Put inserts version 1 (as every release has); the trigger continues
	// above the announced 3.
	again := put(t, r, grantToken("acme", "at-3", "rt-3"))
	if again.Version != 4 {
		t.Errorf("version after reconnection: %d, want 4", again.Version)
	}
	n, err = listen.WaitForNotification(wctx)
	if err != nil || n.Payload != "4 acme" {
		t.Errorf("announcement %v, %v; want 4 acme", n, err)
	}
	wantMetadata(t, r, "acme", `{}`)
}
