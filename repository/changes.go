package repository

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/usecase"
)

// ChangeChannel announces every committed token write as "<version> <connection>" (no secret).
const ChangeChannel = "tokenguard_token_changed"

// ListenerApplicationName names the listener's session in pg_stat_activity.
const ListenerApplicationName = "tokenguard-listener"

// ChangeTarget is told about changes; RefreshTokenUseCase is one.
type ChangeTarget interface {
	Invalidate(connection string, version int64) // the stored token is now at version
	TrustCache(trusted bool)                     // true once listening, false once the feed may have a gap
}

// ChangeListener follows ChangeChannel on a dedicated connection for a ChangeTarget.
type ChangeListener struct {
	config  func() (*pgx.ConnConfig, error) // a new one per connection
	target  ChangeTarget
	log     *slog.Logger
	channel string // ChangeChannel as the tables' schema has it

	beatDB       *gorm.DB // WithHeartbeat; nil: no heartbeat
	beatInterval time.Duration
	beatChannel  string
	beatSeq      atomic.Int64
	lastBeat     atomic.Int64 // Unix nanoseconds of the last beat heard
	trusted      atomic.Bool  // what the target was last told

	onProvider      func(name string) // OnProviderChange; nil: not followed
	providerChannel string

	onConnect func(ctx context.Context) // OnConnect; nil: none
}

// NewChangeListener listens on the database at url for target. log may be nil.
func NewChangeListener(url string, target ChangeTarget, log *slog.Logger) *ChangeListener {
	config := func() (*pgx.ConnConfig, error) { return pgx.ParseConfig(url) }
	return &ChangeListener{config: config, target: target, log: cmp.Or(log, slog.Default())}
}

// DefaultHeartbeat is how often a listener with a heartbeat proves it hears.
const DefaultHeartbeat = time.Second

const (
	heartbeatMisses = 3                      // intervals without a beat that break the feed
	reconnectDelay  = 500 * time.Millisecond // before connecting again
)

// WithHeartbeat makes the listener prove that it hears, as a half-open TCP connection or a pooler
// that swallowed the LISTEN looks alive: every interval it notifies a channel of its own through
// db, and trusts the cache only while those come back; otherwise it reconnects.
func (l *ChangeListener) WithHeartbeat(db *gorm.DB, interval time.Duration) *ChangeListener {
	if interval <= 0 {
		interval = DefaultHeartbeat
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	l.beatDB, l.beatInterval, l.beatChannel = db, interval, "tokenguard_beat_"+hex.EncodeToString(b[:])
	return l
}

// OnProviderChange follows ProviderChannel on the same connection: fn gets the name of a provider
// added, changed or removed, and "" after each (re)connection. fn must be quick.
func (l *ChangeListener) OnProviderChange(fn func(name string)) *ChangeListener {
	l.onProvider = fn
	return l
}

// OnConnect calls fn right after each (re)connection (a failover shows then); fn must be quick.
func (l *ChangeListener) OnConnect(fn func(ctx context.Context)) *ChangeListener {
	l.onConnect = fn
	return l
}

// NewConfigChangeListener listens on the database cfg connects to. log may be nil.
func NewConfigChangeListener(cfg *pgx.ConnConfig, target ChangeTarget, log *slog.Logger) *ChangeListener {
	l := NewChangeListener("", target, log)
	l.config = func() (*pgx.ConnConfig, error) { return cfg.Copy(), nil }
	return l
}

func (l *ChangeListener) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := l.config()
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = ListenerApplicationName
	return pgx.ConnectConfig(ctx, cfg)
}

// Run listens until ctx is done; the target's cache is trusted only while a LISTEN is in place.
func (l *ChangeListener) Run(ctx context.Context) error {
	defer l.trust(false)
	channel, err := l.channelOf(ctx)
	if err != nil {
		return nil // ctx ended before the database answered
	}
	l.channel = channel
	l.providerChannel = ProviderChannel + strings.TrimPrefix(channel, ChangeChannel) // the same schema suffix
	for ctx.Err() == nil {
		l.session(ctx) // a heartbeat lost ends it early: a new connection
	}
	return nil
}

// channelOf asks the database, until it answers or ctx ends, which channel announces changes.
func (l *ChangeListener) channelOf(ctx context.Context) (string, error) {
	for {
		schema, err := func() (string, error) {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			conn, err := l.connect(cctx)
			if err != nil {
				return "", err
			}
			defer conn.Close(context.WithoutCancel(cctx))
			var schema string
			err = conn.QueryRow(cctx, "SELECT current_schema()").Scan(&schema)
			return schema, err
		}()
		if err == nil {
			return ChannelFor(schema), nil
		}
		if ctx.Err() == nil {
			l.log.Warn("token change listener cannot reach the database yet; reading through", "err", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(reconnectDelay):
		}
	}
}

// trust tells the target when trust changes: each change starts a cache epoch, not for every beat.
func (l *ChangeListener) trust(ok bool) {
	if l.trusted.Swap(ok) != ok || !ok {
		l.target.TrustCache(ok)
	}
}

// session is one listening connection until ctx ends, or earlier if the heartbeat stops.
func (l *ChangeListener) session(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.lastBeat.Store(time.Now().UnixNano())
	pl := &pgxlisten.Listener{
		Connect: l.connect,
		LogError: func(ctx context.Context, err error) {
			// Until LISTEN is back, changes may be missed.
			l.trust(false)
			if ctx.Err() == nil {
				l.log.Warn("token change listener lost; reading through until it is back", "err", err)
			}
		},
		ReconnectDelay: reconnectDelay,
	}
	pl.Handle(l.channel, handler{l.listening, l.changed})
	if l.onProvider != nil {
		// Everything is read again after each LISTEN.
		pl.Handle(l.providerChannel, handler{func(context.Context) { l.onProvider("") }, l.onProvider})
	}
	if l.beatDB != nil {
		// The first beat is sent, through the pool, once its channel is listened to.
		pl.Handle(l.beatChannel, handler{l.sendBeat, l.heard})
		var beating sync.WaitGroup
		beating.Go(func() { l.beat(ctx, cancel) })
		defer beating.Wait() // after cancel: nothing logs once Run returned
		defer cancel()
	}
	_ = pl.Listen(ctx) // it returns only when ctx ends
}

// beat sends a heartbeat every interval and ends the session when none is heard.
func (l *ChangeListener) beat(ctx context.Context, end context.CancelFunc) {
	usecase.Every(ctx, l.beatInterval, func() { // end's cancel stops it
		if silent := time.Since(time.Unix(0, l.lastBeat.Load())); silent > heartbeatMisses*l.beatInterval {
			if l.trusted.Load() { // once per outage, not per reconnection
				l.log.Warn("token change listener hears nothing; reading through and reconnecting",
					"silent_for", silent.Round(time.Millisecond))
			}
			l.trust(false)
			end()
			return
		}
		l.sendBeat(ctx)
	})
}

func (l *ChangeListener) sendBeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, l.beatInterval)
	defer cancel()
	seq := strconv.FormatInt(l.beatSeq.Add(1), 10)
	if err := l.beatDB.WithContext(ctx).Exec("SELECT pg_notify(?, ?)", l.beatChannel, seq).Error; err != nil && ctx.Err() == nil {
		l.log.Warn("token change listener heartbeat not sent", "err", storeError(ctx, "heartbeat", err))
	}
}

// handler is what a channel does after each LISTEN (backlog) and with each notification.
type handler struct {
	backlog func(ctx context.Context)
	notify  func(payload string)
}

func (h handler) HandleBacklog(ctx context.Context, _ string, _ *pgx.Conn) error {
	h.backlog(ctx)
	return nil
}

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.notify(n.Payload)
	return nil
}

// listening runs right after LISTEN: the cache may be trusted again (with a heartbeat, once heard).
func (l *ChangeListener) listening(ctx context.Context) {
	if l.onConnect != nil {
		l.onConnect(ctx)
	}
	if l.beatDB == nil {
		l.trust(true)
	}
}

func (l *ChangeListener) changed(payload string) {
	v, id, _ := strings.Cut(payload, " ")
	version, err := strconv.ParseInt(v, 10, 64)
	if err != nil || version < 1 || id == "" {
		l.log.Warn("ignoring token change", "err", fmt.Errorf("malformed change %q", payload))
		return
	}
	l.target.Invalidate(id, version)
}

// heard is a beat come back: every channel is in place and delivers.
func (l *ChangeListener) heard(string) {
	l.lastBeat.Store(time.Now().UnixNano())
	l.trust(true)
}
