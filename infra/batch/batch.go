// Package batch is the batch app: rounds of one external API call per
// active connection, once or on an interval.
package batch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/usecase"
)

// ErrFailed reports that a round had a failed call (or could not list the connections).
var ErrFailed = errors.New("batch: some calls failed")

// Round is one round's summary, a JSON line on the runner's output.
type Round struct {
	Round      int      `json:"round"`
	Calls      int      `json:"calls"`
	Succeeded  int      `json:"succeeded"`
	Failed     int      `json:"failed"`
	Skipped    int      `json:"skipped"`
	DurationMS int64    `json:"duration_ms"`
	Errors     []string `json:"errors,omitempty"`
	// Refresh-ahead sweep of the round (--refresh-ahead), when enabled.
	AheadDue       int `json:"ahead_due,omitempty"`
	AheadRefreshed int `json:"ahead_refreshed,omitempty"`
	AheadBusy      int `json:"ahead_skipped_busy,omitempty"`
	AheadFailed    int `json:"ahead_failed,omitempty"`
	// Keep-alive sweep of the round (--keep-alive), when enabled.
	KeepAliveDue       int `json:"keepalive_due,omitempty"`
	KeepAliveRefreshed int `json:"keepalive_refreshed,omitempty"`
	KeepAliveBusy      int `json:"keepalive_skipped_busy,omitempty"`
	KeepAliveFailed    int `json:"keepalive_failed,omitempty"`
}

// Runner runs rounds.
type Runner struct {
	UseCase *usecase.CallAllUseCase
	Out     io.Writer
	Log     *slog.Logger
	// RoundTimeout bounds one round, which is not cut short by shutdown.
	RoundTimeout time.Duration
	// Ahead, when set, runs at the start of each round: it refreshes the
	// connections about to expire that no other process is refreshing.
	Ahead func(ctx context.Context) (usecase.AheadReport, error)
	// KeepAlive, when set, runs after Ahead: it refreshes connections long
	// unrefreshed, whose refresh tokens some providers let die unused.
	KeepAlive func(ctx context.Context) (usecase.AheadReport, error)
}

// Run makes one round (ErrFailed when it failed), or with every > 0 one per interval until ctx is
// done, finishing the one in flight, and returns nil (failures are in the output and the log).
func (r *Runner) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		if !r.round(ctx, 1) {
			return ErrFailed
		}
		return nil
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 1; ; n++ {
		r.round(ctx, n)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *Runner) round(ctx context.Context, n int) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.RoundTimeout)
	defer cancel()
	start := time.Now()
	var out Round
	aheadOK := r.sweep(ctx, n, "refresh ahead", r.Ahead, &out, &out.AheadDue, &out.AheadRefreshed, &out.AheadBusy, &out.AheadFailed)
	aheadOK = r.sweep(ctx, n, "keep alive", r.KeepAlive, &out, &out.KeepAliveDue, &out.KeepAliveRefreshed, &out.KeepAliveBusy, &out.KeepAliveFailed) && aheadOK
	res, err := r.UseCase.CallAll(ctx)
	out.Round, out.Calls, out.Skipped, out.DurationMS = n, len(res.Calls), len(res.Skipped), time.Since(start).Milliseconds()
	if err != nil {
		out.Errors = append(out.Errors, err.Error())
		r.Log.Error("batch round failed", "round", n, "err", err)
	}
	for _, c := range res.Calls {
		if c.Err != nil {
			out.Failed++
			out.Errors = append(out.Errors, c.Connection+": "+c.Err.Error())
			r.Log.Warn("call failed", "round", n, "connection", c.Connection, "err", c.Err)
		} else {
			out.Succeeded++
		}
	}
	for _, id := range res.Skipped {
		r.Log.Warn("connection needs re-authorisation; skipped", "round", n, "connection", id)
	}
	_ = json.NewEncoder(r.Out).Encode(out) // best effort: the failures are logged too
	return err == nil && out.Failed == 0 && aheadOK
}

// sweep runs a round's sweep, if set, into out's fields; false when some connection failed.
func (r *Runner) sweep(ctx context.Context, n int, name string, run func(context.Context) (usecase.AheadReport, error),
	out *Round, due, refreshed, busy, failed *int) bool {
	if run == nil {
		return true
	}
	rep, err := run(ctx)
	*due, *refreshed, *busy, *failed = rep.Due, rep.Refreshed, rep.Skipped, rep.Failed
	if err != nil {
		out.Errors = append(out.Errors, name+": "+err.Error())
		r.Log.Warn(name+" failed for some connections", "round", n, "failed", rep.Failed, "err", err)
		return false
	}
	return true
}
