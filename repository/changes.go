package repository

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
)

// ChangeChannel is the Postgres NOTIFY channel on which every committed
// token write is announced as "<version> <connection>" (LockedTokens.Save
// and Put notify in the writing statement; Postgres delivers at commit). It
// carries no secret: listeners re-read what they need.
const ChangeChannel = "tokenguard_token_changed"

// ListenerApplicationName names the listener's session in pg_stat_activity.
const ListenerApplicationName = "tokenguard-listener"

// ParseChange reads a ChangeChannel payload.
func ParseChange(payload string) (connectionID string, version int64, err error) {
	v, id, ok := strings.Cut(payload, " ")
	if !ok || id == "" {
		return "", 0, fmt.Errorf("malformed change %q", payload)
	}
	version, err = strconv.ParseInt(v, 10, 64)
	if err != nil || version < 1 {
		return "", 0, fmt.Errorf("malformed change %q", payload)
	}
	return id, version, nil
}

// ChangeTarget is told about changes; RefreshTokenUseCase is one.
type ChangeTarget interface {
	// Invalidate: connectionID's stored token is now at version.
	Invalidate(connectionID string, version int64)
	// TrustCache: true once listening (nothing can be missed from now on),
	// false as soon as the feed may have a gap.
	TrustCache(trusted bool)
}

// ChangeListener follows ChangeChannel on a dedicated connection and keeps
// a ChangeTarget informed, reconnecting when the connection is lost.
type ChangeListener struct {
	url            string
	target         ChangeTarget
	log            *slog.Logger
	reconnectDelay time.Duration
}

// NewChangeListener listens on the database at url for target. log may be nil.
func NewChangeListener(url string, target ChangeTarget, log *slog.Logger) *ChangeListener {
	if log == nil {
		log = slog.Default()
	}
	return &ChangeListener{url: url, target: target, log: log, reconnectDelay: 500 * time.Millisecond}
}

// Run listens until ctx is done. The target's cache is trusted only while
// a LISTEN is in place.
func (l *ChangeListener) Run(ctx context.Context) error {
	defer l.target.TrustCache(false)
	pl := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cfg, err := pgx.ParseConfig(l.url)
			if err != nil {
				return nil, err
			}
			cfg.RuntimeParams["application_name"] = ListenerApplicationName
			return pgx.ConnectConfig(ctx, cfg)
		},
		LogError: func(ctx context.Context, err error) {
			// Every error that reaches here ends or precedes a
			// (re)connection: until LISTEN is back, changes may be missed.
			l.target.TrustCache(false)
			if ctx.Err() == nil {
				l.log.Warn("token change listener lost; reading through until it is back", "err", err)
			}
		},
		ReconnectDelay: l.reconnectDelay,
	}
	pl.Handle(ChangeChannel, changeHandler{l})
	err := pl.Listen(ctx)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

type changeHandler struct{ l *ChangeListener }

// HandleBacklog runs right after LISTEN succeeded: from now on nothing is
// missed, so the cache may be trusted again (in a new epoch).
func (h changeHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.l.target.TrustCache(true)
	return nil
}

func (h changeHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	id, version, err := ParseChange(n.Payload)
	if err != nil {
		h.l.log.Warn("ignoring token change", "err", err)
		return nil
	}
	h.l.target.Invalidate(id, version)
	return nil
}
