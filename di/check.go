package di

import (
	"context"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// Check is tokenctl check.
func (b tokenctlBackend) Check(ctx context.Context) (provider.CheckResult, error) {
	cfg, err := b.config()
	if err != nil {
		return provider.CheckResult{}, err
	}
	if err := cfg.RequireOAuth(); err != nil {
		return provider.CheckResult{}, &tokenctl.ConfigError{Err: err}
	}
	client := agentClient(10*time.Second, "tokenctl")
	opts, err := tokenRequestOptions(cfg, client)
	if err != nil {
		return provider.CheckResult{}, &tokenctl.ConfigError{Err: err}
	}
	return provider.Check(ctx, OAuth2Config(cfg.OAuth), client, opts...), nil
}

// checkAtStart logs the token endpoint check's verdict, and keeps its answer as evidence.
func checkAtStart(ctx context.Context, cfg Config, app string, evidence provider.EvidenceStore, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		client := agentClient(cfg.RefreshTimeout, app)
		opts, err := tokenRequestOptions(cfg, client)
		if err != nil {
			log.Error("token endpoint check: not run", "err", err)
			return
		}
		res := provider.Check(ctx, OAuth2Config(cfg.OAuth), client, opts...)
		if ctx.Err() != nil {
			return // stopped before the endpoint answered: nothing to tell
		}
		if err := provider.RecordCheck(ctx, evidence, OAuth2Config(cfg.OAuth), res); err != nil {
			log.Warn("token endpoint check: its answer could not be kept; ambiguous refusals stay unclassified", "err", err)
		}
		level := slog.LevelError
		switch res.Verdict {
		case provider.CheckOK:
			level = slog.LevelInfo
		case provider.CheckInconclusive:
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "token endpoint check: "+res.String(),
			"verdict", res.Verdict.String(), "auth_style", res.Style())
	}()
	return func() { cancel(); <-done }
}
