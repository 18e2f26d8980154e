// Package queue carries events from the server to the worker through River, a job queue in the
// tokens' Postgres database: an event is a row, none is lost when a process dies, a failed one is retried.
package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tracing"
)

// EventArgs is one event: the worker calls the external API with the connection's token.
type EventArgs struct {
	Connection string          `json:"connection"`
	Payload    json.RawMessage `json:"payload,omitempty"`
}

// Kind names the job kind in River's tables.
func (EventArgs) Kind() string { return "tokenguard_event" }

// OpenPool opens the pgx pool River runs on (not the token store's pool).
func OpenPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("queue: parse database URL: %w", err)
	}
	cfg.MaxConns = max(maxConns, 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("queue: open pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("queue: connect to database: %w", err)
	}
	return pool, nil
}

// migrateLockKey serialises River migrations across processes (rivermigrate
// takes no lock), in the int8 advisory key space apart from connection locks.
const migrateLockKey int64 = 0x746b675f72697672 // "tkg_rivr"

// Migrate applies River's pending migrations; concurrent callers wait.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("queue: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return fmt.Errorf("queue: migrate: lock: %w", err)
	}
	defer func() {
		_, unlockErr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey)
		if err == nil && unlockErr != nil {
			err = fmt.Errorf("queue: migrate: unlock: %w", unlockErr)
		}
	}()
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("queue: migrate: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("queue: migrate: %w", err)
	}
	return nil
}

// Producer enqueues events (the server's side).
type Producer struct {
	client *river.Client[pgx.Tx]
}

// NewProducer builds an insert-only River client on pool.
func NewProducer(pool *pgxpool.Pool, log *slog.Logger) (*Producer, error) {
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: riverLogger(log)})
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	return &Producer{client: c}, nil
}

// Enqueue stores one event and returns its job id; the job's span joins ctx's trace.
func (p *Producer) Enqueue(ctx context.Context, connection string, payload json.RawMessage) (int64, error) {
	res, err := p.client.Insert(ctx, EventArgs{Connection: connection, Payload: payload}, &river.InsertOpts{Metadata: traceMetadata(ctx)})
	if err != nil {
		return 0, fmt.Errorf("queue: insert event: %w: %w", domain.ErrStoreUnavailable, err)
	}
	return res.Job.ID, nil
}

// HandlerFunc handles one event.
type HandlerFunc func(ctx context.Context, e EventArgs) error

// WorkerOptions tune a Worker. Zero values take the defaults.
type WorkerOptions struct {
	Concurrency int           // events handled at once (default 10)
	JobTimeout  time.Duration // bounds one event (default 1m)
	// RescueAfter: an event "running" longer is retried as lost (default JobTimeout+15s).
	RescueAfter time.Duration
	// StopTimeout bounds the wait for events in flight at shutdown (default 8s); then they are cancelled.
	StopTimeout time.Duration
	Webhook     *Webhook // delivers the outbox's events; nil drops them
	// PollOnly polls instead of LISTEN (which needs a session of its own): for a transaction pooler.
	PollOnly bool
	// ExpiringNotice, with a Webhook, announces once per grant a refresh token expiring within it; 0: never.
	ExpiringNotice time.Duration
}

// Worker consumes events (the worker's side).
type Worker struct {
	client *river.Client[pgx.Tx]
	pool   *pgxpool.Pool
	log    *slog.Logger
	opts   WorkerOptions
}

// NewWorker builds a River client that works events with h.
func NewWorker(pool *pgxpool.Pool, h HandlerFunc, opts WorkerOptions, log *slog.Logger) (*Worker, error) {
	opts.Concurrency = cmp.Or(opts.Concurrency, 10)
	opts.JobTimeout = cmp.Or(opts.JobTimeout, time.Minute)
	if opts.RescueAfter <= opts.JobTimeout {
		opts.RescueAfter = opts.JobTimeout + 15*time.Second
	}
	opts.StopTimeout = cmp.Or(opts.StopTimeout, 8*time.Second)
	// AddWorker panics only for a kind added twice: two fixed, distinct kinds here.
	workers := river.NewWorkers()
	river.AddWorker(workers, &eventWorker{h: h, log: log, tracer: tracing.New(nil)})
	queues := map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: opts.Concurrency}}
	if opts.Webhook != nil {
		river.AddWorker(workers, newWebhookWorker(*opts.Webhook, log))
		queues[webhookQueue] = river.QueueConfig{MaxWorkers: 4}
	}
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:               riverLogger(log),
		Queues:               queues,
		Workers:              workers,
		JobTimeout:           opts.JobTimeout,
		RescueStuckJobsAfter: opts.RescueAfter,
		PollOnly:             opts.PollOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	return &Worker{client: c, pool: pool, log: log, opts: opts}, nil
}

// Run works events until ctx is done, then lets those in flight finish (bounded by StopTimeout).
func (w *Worker) Run(ctx context.Context) error {
	if err := w.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("queue: start worker: %w", err)
	}
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); w.relay(ctx) }()
	defer func() { <-relayDone }()
	select {
	case <-ctx.Done():
	case <-w.client.Stopped():
		return errors.New("queue: worker stopped unexpectedly")
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), w.opts.StopTimeout)
	defer cancel()
	if err := w.client.Stop(stopCtx); err != nil {
		w.log.Warn("events still in flight at the stop deadline; cancelling them, they will be retried", "err", err)
		hardCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := w.client.StopAndCancel(hardCtx); err != nil {
			return fmt.Errorf("queue: stop worker: %w", err)
		}
	}
	return nil
}

// relay moves the webhook outbox into River each second until ctx is done.
func (w *Worker) relay(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	failing := false
	var announced time.Time
	for {
		if w.opts.Webhook != nil && w.opts.ExpiringNotice > 0 && time.Since(announced) >= expiringEvery {
			announced = time.Now()
			if n, err := announceExpiring(ctx, w.pool, w.opts.ExpiringNotice); err != nil && ctx.Err() == nil {
				w.log.Warn("expiring connections not announced; will retry", "err", err)
			} else if n > 0 {
				w.log.Info("connections announced as expiring", "connections", n, "notice", w.opts.ExpiringNotice)
			}
		}
		n, err := relayOutbox(ctx, w.pool, w.client, w.opts.Webhook != nil)
		if err != nil && ctx.Err() == nil && !failing {
			w.log.Warn("webhook outbox not relayed; will retry", "err", err)
		}
		failing = err != nil // warn once per run of failures
		if err == nil && n > 0 {
			msg := "webhook events queued"
			if w.opts.Webhook == nil {
				msg = "webhook events dropped: WEBHOOK_URL is not set"
			}
			w.log.Debug(msg, "events", n)
			continue // more may wait
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type eventWorker struct {
	river.WorkerDefaults[EventArgs]
	h      HandlerFunc
	log    *slog.Logger
	tracer *tracing.Tracer
}

func (w *eventWorker) Work(ctx context.Context, job *river.Job[EventArgs]) (err error) {
	ctx, end := w.tracer.Call(withTrace(ctx, job.Metadata), "tokenguard.job", job.Args.Connection, trace.SpanKindConsumer,
		attribute.Int64("tokenguard.job.id", job.ID), attribute.Int("tokenguard.job.attempt", job.Attempt))
	defer func() { end(err) }()
	log := w.log.With("event_id", job.ID, "connection", job.Args.Connection)
	err = w.h(ctx, job.Args)
	switch {
	case err == nil:
		log.Debug("event handled")
		return nil
	case errors.Is(err, domain.ErrNotFound), errors.Is(err, domain.ErrInvalidConnection):
		// Retrying cannot bring the connection back.
		log.Warn("event dropped: unknown connection", "err", err)
		return river.JobCancel(err)
	default:
		log.Warn("event failed; will retry", "attempt", job.Attempt, "err", err)
		return err
	}
}

// riverLogger is log for River's own chatter: its warnings and errors only.
func riverLogger(log *slog.Logger) *slog.Logger { return slog.New(warnings{log.Handler()}) }

type warnings struct{ slog.Handler }

func (h warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnings) WithAttrs(as []slog.Attr) slog.Handler { return warnings{h.Handler.WithAttrs(as)} }

func (h warnings) WithGroup(name string) slog.Handler { return warnings{h.Handler.WithGroup(name)} }

// traceMetadata is job metadata carrying ctx's W3C trace context; nil when ctx has none.
func traceMetadata(ctx context.Context) []byte {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	b, _ := json.Marshal(carrier) // a map of strings always marshals
	return b
}

// withTrace is ctx continuing the trace a job's metadata carries, if any.
func withTrace(ctx context.Context, metadata []byte) context.Context {
	carrier := propagation.MapCarrier{}
	_ = json.Unmarshal(metadata, &carrier) // fields that are not strings (River's own) are skipped
	return propagation.TraceContext{}.Extract(ctx, carrier)
}
