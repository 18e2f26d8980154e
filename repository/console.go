package repository

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// ConsoleSessions stores the operator console's sessions by the SHA-256 of their token, each bound
// to the API key that logged in: revoking the key deletes its sessions (ON DELETE CASCADE).
type ConsoleSessions struct{ db *gorm.DB }

// NewConsoleSessions binds the store to a pool.
func NewConsoleSessions(db *gorm.DB) *ConsoleSessions { return &ConsoleSessions{db: db} }

// Create opens a session for the API key keyID, good for lifetime, deleting expired ones.
func (c *ConsoleSessions) Create(ctx context.Context, keyID int32, lifetime time.Duration) (domain.Secret, time.Time, error) {
	token := domain.NewCredential(domain.ConsolePrefix)
	expires, err := scan[time.Time](ctx, c.db, "create console session", `INSERT INTO tokenguard_console_sessions (token_hash, api_key_id, expires_at)
VALUES (decode(?, 'hex'), ?, now() + ? * interval '1 millisecond') RETURNING expires_at`,
		hashParam(token), keyID, lifetime.Milliseconds())
	if err != nil {
		return domain.Secret{}, time.Time{}, err
	}
	_ = exec(ctx, c.db, "delete expired console sessions", "DELETE FROM tokenguard_console_sessions WHERE expires_at < now()")
	return token, expires, nil
}

// Lookup returns the key of token's session and what that key may do now; domain.ErrUnauthorized
// when there is none: never created, logged out, expired, or its key revoked.
func (c *ConsoleSessions) Lookup(ctx context.Context, token domain.Secret) (domain.KeyAccess, error) {
	row, err := oneRow[keyRow](ctx, c.db, "read console session", domain.ErrUnauthorized, "SELECT "+keyColumns+` FROM tokenguard_api_keys WHERE id = (
    SELECT api_key_id FROM tokenguard_console_sessions WHERE token_hash = decode(?, 'hex') AND expires_at > now())`, hashParam(token))
	if err != nil {
		return domain.KeyAccess{}, err
	}
	return row.access(), nil
}

// Delete ends the session of token (logout); an unknown one is no error.
func (c *ConsoleSessions) Delete(ctx context.Context, token domain.Secret) error {
	return exec(ctx, c.db, "delete console session", "DELETE FROM tokenguard_console_sessions WHERE token_hash = decode(?, 'hex')", hashParam(token))
}

// ConnectionEvents reads the history the triggers write.
type ConnectionEvents struct{ db *gorm.DB }

// NewConnectionEvents binds the store to a pool.
func NewConnectionEvents(db *gorm.DB) *ConnectionEvents { return &ConnectionEvents{db: db} }

// History bounds: what the console shows and what EventPruner keeps.
const (
	EventsPerConnection = 100
	EventsMaxAge        = 30 * 24 * time.Hour
)

// eventColumns read a domain.ConnectionEvent: NULL version and duration as 0, the duration in ns.
const eventColumns = `id, connection, kind, outcome, reason, provider, coalesce(version, 0) AS version,
    coalesce(duration_ms, 0) * 1000000 AS duration, occurred_at AS at`

// Recent returns connection's last limit events (<= EventsPerConnection), newest first.
func (e *ConnectionEvents) Recent(ctx context.Context, connection string, limit int) ([]domain.ConnectionEvent, error) {
	return allRows(ctx, e.db, "read connection events", asIs[domain.ConnectionEvent], `SELECT `+eventColumns+` FROM tokenguard_connection_events
WHERE connection = ? AND occurred_at > now() - ? * interval '1 second' ORDER BY id DESC LIMIT ?`,
		connection, int64(EventsMaxAge/time.Second), min(limit, EventsPerConnection))
}

// LastRefreshes returns, by name, the last refresh of each of connections: one index probe per name.
func (e *ConnectionEvents) LastRefreshes(ctx context.Context, connections []string) (map[string]domain.ConnectionEvent, error) {
	if len(connections) == 0 {
		return map[string]domain.ConnectionEvent{}, nil
	}
	return keyedRows(ctx, e.db, "read last refreshes", func(ev domain.ConnectionEvent) (string, domain.ConnectionEvent) { return ev.Connection, ev },
		`SELECT l.* FROM unnest(?::text[]) AS n(name), LATERAL (
    SELECT `+eventColumns+` FROM tokenguard_connection_events
    WHERE connection = n.name AND kind = 'refresh' ORDER BY id DESC LIMIT 1) l`, tagArray(connections))
}

// RefreshRates counts each provider's refreshes since since, and those that stored a rotated token; "" is OAUTH_*'s.
func (e *ConnectionEvents) RefreshRates(ctx context.Context, since time.Time) (map[string]domain.RefreshRate, error) {
	return keyedRows(ctx, e.db, "read refresh rates", func(r domain.RefreshRate) (string, domain.RefreshRate) { return r.Provider, r }, `SELECT provider,
    count(*) FILTER (WHERE outcome = 'ok') AS ok, count(*) AS total
FROM tokenguard_connection_events WHERE occurred_at >= ? AND kind = 'refresh' GROUP BY provider`, since)
}

// EventPruner keeps tokenguard_connection_events bounded: rows older than EventsMaxAge go, and of
// each connection written to since its last round only the last EventsPerConnection stay.
type EventPruner struct {
	db   *gorm.DB
	seen int64 // the highest id the last round looked at
}

// NewEventPruner binds the pruner to a pool.
func NewEventPruner(db *gorm.DB) *EventPruner { return &EventPruner{db: db} }

// Prune runs one round and returns how many rows it deleted.
func (p *EventPruner) Prune(ctx context.Context) (int64, error) {
	db := p.db.WithContext(ctx)
	old := db.Exec(`DELETE FROM tokenguard_connection_events WHERE id IN (
    SELECT id FROM tokenguard_connection_events WHERE occurred_at < now() - ? * interval '1 second' LIMIT 10000)`,
		int64(EventsMaxAge/time.Second))
	if old.Error != nil {
		return 0, storeError(ctx, "prune old connection events", old.Error)
	}
	top, err := scan[int64](ctx, db, "prune connection events", "SELECT coalesce(max(id), 0) FROM tokenguard_connection_events")
	if err != nil {
		return old.RowsAffected, err
	}
	over := db.Exec(`DELETE FROM tokenguard_connection_events e USING (
    SELECT DISTINCT connection FROM tokenguard_connection_events WHERE id > ? AND id <= ?) w
WHERE e.connection = w.connection AND e.id < (
    SELECT x.id FROM tokenguard_connection_events x WHERE x.connection = w.connection
    ORDER BY x.id DESC OFFSET ? LIMIT 1)`, p.seen, top, EventsPerConnection-1)
	if over.Error != nil {
		return old.RowsAffected, storeError(ctx, "prune connection events", over.Error)
	}
	p.seen = top
	return old.RowsAffected + over.RowsAffected, nil
}

// Run prunes now and every interval until ctx ends; failures wait for the next round.
func (p *EventPruner) Run(ctx context.Context, interval time.Duration, onErr func(error)) {
	round := func() {
		roundCtx, cancel := context.WithTimeout(ctx, interval)
		defer cancel()
		if _, err := p.Prune(roundCtx); err != nil && ctx.Err() == nil && onErr != nil {
			onErr(fmt.Errorf("connection history: %w", err))
		}
	}
	round()
	usecase.Every(ctx, interval, round)
}
