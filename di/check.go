package di

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// checkEndpoint asks the token endpoint about the client as the token layer
// would authenticate it: client key, resource indicator.
func checkEndpoint(ctx context.Context, cfg Config, client *http.Client) provider.CheckResult {
	prof, _ := profiles.Get(cfg.OAuth.Profile)
	opts := provider.ClientOptions(cfg.OAuth.Resource, cfg.OAuth.key, prof, provider.NewDiscovery(client))
	return provider.Check(ctx, OAuth2Config(cfg.OAuth), client, opts...)
}

// checkAtStart logs the token endpoint check's verdict, and keeps its answer as evidence.
func checkAtStart(ctx context.Context, cfg Config, app string, evidence provider.EvidenceStore, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() {
		res := checkEndpoint(ctx, cfg, agentClient(cfg.RefreshTimeout, app))
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
	})
	return func() { cancel(); done.Wait() }
}
