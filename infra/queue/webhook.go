package queue

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/tokenguard/tokenguard/domain"
)

// WebhookEvent is one event as the receiver gets it (the JSON body). ID is
// the same on every attempt: receivers deduplicate on it.
type WebhookEvent struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"` // connection.connected, connection.needs_reauth, connection.recovered, connection.rolled_back, connection.refresh_failing, connection.expiring, connection.disconnected, connection.scopes_reduced
	Connection string          `json:"connection"`
	OccurredAt time.Time       `json:"occurred_at"`
	Data       json.RawMessage `json:"data"`
}

// Kind names the job kind in River's tables.
func (WebhookEvent) Kind() string { return "tokenguard_webhook" }

// webhookQueue keeps deliveries to a slow receiver from holding up events.
const webhookQueue = "webhook"

// InsertOpts puts events on their own queue with their own retry budget: 25 attempts backing off
// (1s doubling, capped at 1h) are about 13 hours of retries before an event is discarded.
func (WebhookEvent) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: webhookQueue, MaxAttempts: 25}
}

// Webhook is where events go and how they are signed.
type Webhook struct {
	URL       string
	Secret    domain.Secret
	UserAgent string // default tokenguard
}

// Signature header: t is the Unix time of the attempt, v1 the hex
// HMAC-SHA256 of "<t>.<body>" under the webhook secret.
const (
	SignatureHeader = "Tokenguard-Signature"
	EventIDHeader   = "Tokenguard-Event-Id"
	EventTypeHeader = "Tokenguard-Event-Type"
)

// Sign returns the signature header's value for body sent at t.
func Sign(secret domain.Secret, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret.Reveal()))
	mac.Write(append([]byte(ts+"."), body...))
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

type webhookWorker struct {
	river.WorkerDefaults[WebhookEvent]
	hook Webhook
	http *http.Client
	log  *slog.Logger
	host string // for logs: the URL's query may hold a credential
}

func newWebhookWorker(h Webhook, log *slog.Logger) *webhookWorker {
	h.UserAgent = cmp.Or(h.UserAgent, "tokenguard")
	w := &webhookWorker{hook: h, log: log, http: &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}} // a redirect fails
	if u, err := url.Parse(h.URL); err == nil {
		w.host = u.Host
	}
	return w
}

// Work delivers one event: anything but a 2xx answer is retried.
func (w *webhookWorker) Work(ctx context.Context, job *river.Job[WebhookEvent]) error {
	body, err := json.Marshal(job.Args)
	if err != nil {
		return river.JobCancel(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.hook.URL, bytes.NewReader(body))
	if err != nil {
		return river.JobCancel(fmt.Errorf("webhook request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", w.hook.UserAgent)
	req.Header.Set(EventIDHeader, job.Args.ID)
	req.Header.Set(EventTypeHeader, job.Args.Type)
	req.Header.Set(SignatureHeader, Sign(w.hook.Secret, time.Now(), body))
	log := w.log.With("event_id", job.Args.ID, "type", job.Args.Type, "connection", job.Args.Connection)
	resp, err := w.http.Do(req)
	if err != nil {
		log.Warn("webhook delivery failed; will retry", "host", w.host, "attempt", job.Attempt, "err", "no answer")
		return fmt.Errorf("webhook %s: no answer", w.host)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		log.Warn("webhook delivery refused; will retry", "host", w.host, "attempt", job.Attempt,
			"status", resp.StatusCode)
		return fmt.Errorf("webhook %s answered %d", w.host, resp.StatusCode)
	}
	log.Info("webhook delivered", "attempt", job.Attempt)
	return nil
}

// NextRetry backs off 1s, 2s, 4s … capped at 1h, with 10% jitter.
func (w *webhookWorker) NextRetry(job *river.Job[WebhookEvent]) time.Time {
	d := time.Hour
	if n := job.Attempt - 1; n < 12 {
		d = time.Second << max(n, 0)
	}
	return time.Now().Add(d + time.Duration(rand.Int64N(int64(d/10)+1)))
}

// Timeout bounds one delivery.
func (w *webhookWorker) Timeout(*river.Job[WebhookEvent]) time.Duration { return 15 * time.Second }

// relayOutbox moves up to 100 outbox rows into River jobs in one
// transaction (each event exactly one job); without a webhook it drops them.
func relayOutbox(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], deliver bool) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `WITH moved AS (
    DELETE FROM tokenguard_webhook_outbox WHERE id IN (
        SELECT id FROM tokenguard_webhook_outbox ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
    RETURNING id, event_id, type, connection, occurred_at, data)
SELECT event_id, type, connection, occurred_at, data FROM moved ORDER BY id`)
	if err != nil {
		return 0, err
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[WebhookEvent])
	if err != nil || len(events) == 0 {
		return 0, err
	}
	if deliver {
		params := make([]river.InsertManyParams, len(events))
		for i, e := range events {
			params[i].Args = e
		}
		if _, err := client.InsertManyTx(ctx, tx, params); err != nil {
			return 0, err
		}
	}
	return len(events), tx.Commit(ctx)
}

// expiringEvery is how often to look for connections to announce: the notice is days ahead.
const expiringEvery = time.Minute

// expiringSQL queues connection.expiring for up to 500 active connections
// whose refresh token expires within $1 seconds, once per grant (the
// notice's primary key; a new grant deletes its notice) however many workers run.
const expiringSQL = `
WITH noticed AS (
    INSERT INTO tokenguard_expiry_notices (connection_id, refresh_expiry)
    SELECT t.connection_id, t.refresh_expiry FROM tokenguard_tokens t
    WHERE t.status = 'active' AND t.refresh_expiry IS NOT NULL
      AND t.refresh_expiry < now() + $1 * interval '1 second'
      AND NOT EXISTS (SELECT FROM tokenguard_expiry_notices n WHERE n.connection_id = t.connection_id)
    ORDER BY t.refresh_expiry LIMIT 500
    ON CONFLICT (connection_id) DO NOTHING
    RETURNING connection_id, refresh_expiry
)
INSERT INTO tokenguard_webhook_outbox (type, connection, data)
SELECT 'connection.expiring', c.name, jsonb_strip_nulls(jsonb_build_object(
           'status', t.status,
           'refresh_expiry', n.refresh_expiry,
           'version', t.version,
           'account', t.granted_account,
           'provider', t.provider,
           'metadata', c.metadata,
           'tags', to_jsonb(c.tags)))
FROM noticed n JOIN tokenguard_tokens t ON t.connection_id = n.connection_id JOIN tokenguard_connections c ON c.id = n.connection_id`

// announceExpiring queues the due connection.expiring events.
func announceExpiring(ctx context.Context, pool *pgxpool.Pool, notice time.Duration) (int, error) {
	tag, err := pool.Exec(ctx, expiringSQL, int64(notice/time.Second))
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
