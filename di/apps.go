package di

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/infra/queue"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// shutdownGrace bounds the work in flight after SIGTERM, inside an orchestrator's 10 s.
const shutdownGrace = 8 * time.Second

// Server is the HTTP app, ready to run.
type Server struct {
	srv    *httpapi.Server
	addr   string
	sweep  func(context.Context) (int, error)
	pruner *repository.EventPruner
	log    *slog.Logger
}

// Run serves on HTTP_ADDR until ctx is done, sweeping the unredeemed connect results.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR: %w", err)
	}
	// Both rounds end before Run returns: the caller closes the pool next.
	bgCtx, stop := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stop()
	bg.Go(func() {
		usecase.Every(bgCtx, sweepEvery, func() {
			if _, err := s.sweep(bgCtx); err != nil && bgCtx.Err() == nil {
				s.log.Warn("sweeping the expired connect results failed; trying again", "err", err)
			}
		})
	})
	bg.Go(func() {
		s.pruner.Run(bgCtx, eventsPruneEvery, func(err error) { s.log.Warn("pruning failed; next round in a minute", "err", err) })
	})
	return s.srv.Serve(ctx, ln, shutdownGrace)
}

// NewServer wires the HTTP app. Call the returned cleanup when done.
func NewServer(ctx context.Context, cfg AppConfig, log *slog.Logger) (*Server, func(), error) {
	a, closeApp, err := newApp(ctx, cfg, "server", 4, log)
	if err != nil {
		return nil, nil, err
	}
	cleanup := cleanups{closeApp}
	fail := func(err error) (*Server, func(), error) { cleanup.run(); return nil, nil, err }
	producer, err := queue.NewProducer(a.pool, log)
	if err != nil {
		return fail(err)
	}
	// The keyless public routes (browser flow, /healthz) and the console get small pools apart from the token layer's.
	var pools [2]*gorm.DB
	for i, conns := range []int{browserConns, consoleConns} {
		db, closeDB, err := openDB(ctx, cfg.DatabaseURL, conns, log)
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, closeDB)
		pools[i] = db
	}
	publicDB, operatorDB := pools[0], pools[1]
	if httpapi.ControlBuild {
		publicDB, operatorDB = a.tokens.DB, a.tokens.DB // the e2e tests' control: one pool, as before
	}
	sqlDB, err := publicDB.DB()
	if err != nil {
		return fail(err)
	}
	apiBase, _ := url.Parse(cfg.APIBaseURL) // checked with the configuration
	srv := httpapi.New(httpapi.Deps{
		Tokens:          a.tokens.Guard,
		APIBaseURL:      apiBase,
		APIBases:        providerBases{providers: a.tokens.Guard.ProviderRegistry()},
		UpstreamTimeout: cfg.APITimeout,
		UserAgent:       UserAgent("server"),
		Events:          usecase.NewEnqueueEventUseCase(a.tokens.Repository, producer),
		Flows:           a.tokens.Guard,
		Connections:     a.tokens.Repository,
		Providers:       a.tokens.Guard.ProviderRegistry(),
		Keys:            repository.NewKeyCache(repository.NewAPIKeys(a.tokens.DB), 0),
		Sessions:        repository.NewConnectSessions(publicDB),
		DB:              sqlDB,
		OAuth:           a.tokens.OAuth,
		Metrics:         a.metrics,
		Observer:        a.connects,
		Log:             log,
		Edges:           cfg.edges(),
	})
	con, err := newConsole(cfg, a, srv, operatorDB, log)
	if err != nil {
		return fail(err)
	}
	srv.MountConsole(con)
	return &Server{srv: srv, addr: cfg.HTTPAddr, sweep: a.tokens.Guard.SweepConnectResults,
		pruner: repository.NewEventPruner(a.tokens.DB), log: log}, cleanup.run, nil
}

const (
	browserConns     = 3               // the public routes' pool
	consoleConns     = 2               // the console's pool
	sweepEvery       = 5 * time.Second // sweeps of the unredeemed connect results
	eventsPruneEvery = time.Minute     // trims of the connections' history
)

// NewWorker wires the event consumer. Call the returned cleanup when done.
func NewWorker(ctx context.Context, cfg AppConfig, log *slog.Logger) (*queue.Worker, func(), error) {
	a, cleanup, err := newApp(ctx, cfg, "worker", int32(cfg.WorkerConcurrency)+4, log)
	if err != nil {
		return nil, nil, err
	}
	handle := queue.HandlerFunc(func(ctx context.Context, e queue.EventArgs) error {
		return a.api.Call(ctx, e.Connection, httpapi.ResourcePath)
	})
	w, err := queue.NewWorker(a.pool, handle, queue.WorkerOptions{
		Concurrency: cfg.WorkerConcurrency,
		JobTimeout:  cfg.WorkerJobTimeout,
		// A refresh outlives a cancelled job by up to the refresh timeout.
		RescueAfter:    cfg.WorkerJobTimeout + cfg.RefreshTimeout + 2*time.Second,
		StopTimeout:    shutdownGrace,
		Webhook:        cfg.webhook("worker"),
		ExpiringNotice: cfg.ExpiringNotice,
		PollOnly:       cfg.ListenURL() != cfg.DatabaseURL, // behind a pooler River's LISTEN hears nothing
	}, log)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return w, cleanup, nil
}

// NewBatch wires the batch job; its rounds' summaries go to out.
func NewBatch(ctx context.Context, cfg AppConfig, out io.Writer, log *slog.Logger, ahead RefreshAhead) (*batch.Runner, func(), error) {
	a, cleanup, err := newApp(ctx, cfg, "batch", 0, log)
	if err != nil {
		return nil, nil, err
	}
	r := &batch.Runner{
		UseCase:      usecase.NewCallAllUseCase(a.tokens.Repository, a.api, httpapi.ResourcePath, 4),
		Out:          out,
		Log:          log,
		RoundTimeout: 2*(cfg.LockWait+cfg.RefreshTimeout) + 3*cfg.APITimeout, // a round of calls, then the keep-alive's
	}
	if ahead.Window > 0 {
		r.Ahead = func(ctx context.Context) (usecase.AheadReport, error) {
			return a.tokens.RefreshToken.RefreshAhead(ctx, a.tokens.Repository, ahead.Window, ahead.Concurrency)
		}
		// A sweep over many connections takes longer than one round of calls.
		r.RoundTimeout += ahead.Window
	}
	// Always: stored providers have their own keep-alive. Without --keep-alive, the OAUTH_* one is half its profile's idle expiry.
	if p, err := profiles.Get(cfg.OAuth.Profile); ahead.KeepAlive == 0 && cfg.OAuth.Profile != "" && err == nil &&
		p.RefreshIdle.Known && p.RefreshIdle.D > 0 {
		ahead.KeepAlive = p.RefreshIdle.D / 2
		log.Info("keep-alive from the provider profile: connections not refreshed for half its refresh token idle expiry are refreshed",
			"profile", p.Name, "keep_alive", ahead.KeepAlive)
	}
	r.KeepAlive = func(ctx context.Context) (usecase.AheadReport, error) {
		return a.tokens.RefreshToken.KeepAlive(ctx, a.tokens.Repository, ahead.KeepAlive, ahead.Concurrency)
	}
	return r, cleanup, nil
}

// RefreshAhead configures the batch's --refresh-ahead and --keep-alive.
type RefreshAhead struct {
	Window      time.Duration // refresh connections expiring within this; 0 disables
	KeepAlive   time.Duration // refresh connections not refreshed for this long; 0 disables
	Concurrency int           // refresh requests at the provider at once, for both
}

// app is what the three apps share.
type app struct {
	tokens   *Tokens
	api      *apiclient.Client
	pool     *pgxpool.Pool // only for the apps that use the queue
	metrics  http.Handler  // GET /metrics
	connects *metrics.ConnectCounter
}

// newApp opens the shared parts; queueConns > 0 also opens (and migrates) the queue's pool.
func newApp(ctx context.Context, cfg AppConfig, name string, queueConns int32, log *slog.Logger) (*app, func(), error) {
	if err := cfg.requireAPI(); err != nil {
		return nil, nil, err
	}
	reg := metrics.NewRegistry()
	m := metrics.HandlerFor(reg, log)
	tokens, closeTokens, err := NewTokens(ctx, cfg.Config, log, TokenOptions{App: name, Registry: reg, ConnectionLabel: cfg.MetricsConnectionLabel})
	if err != nil {
		return nil, nil, err
	}
	cleanup := cleanups{closeTokens}
	fail := func(err error) (*app, func(), error) { cleanup.run(); return nil, nil, err }
	if cfg.EndpointCheck {
		cleanup = append(cleanup, checkAtStart(ctx, cfg.Config, name, repository.NewRefusalEvidence(tokens.DB), log))
	} else {
		log.Info("token endpoint check: off (TOKEN_ENDPOINT_CHECK=false); a misconfigured client shows at the first refresh")
	}
	if cfg.MetricsAddr != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsAddr, m, log)
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, stopMetrics)
	}
	api, err := apiclient.New(cfg.APIBaseURL, tokens.Guard, apiclient.Options{
		UserAgent: UserAgent(name),
		Timeout:   cfg.APITimeout,
		Bases:     providerBases{tokens: tokens.RefreshToken, providers: tokens.Guard.ProviderRegistry()},
	})
	if err != nil {
		return fail(err)
	}
	a := &app{tokens: tokens, api: api, metrics: m, connects: metrics.NewConnectCounter(reg)}
	if queueConns == 0 {
		return a, cleanup.run, nil
	}
	if a.pool, err = queue.OpenPool(ctx, cfg.DatabaseURL, queueConns); err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, a.pool.Close)
	if cfg.MigrateOnStart {
		if cfg.MigrateURL() == cfg.DatabaseURL {
			err = queue.Migrate(ctx, a.pool)
		} else {
			err = migrateQueueAt(ctx, cfg.MigrateURL())
		}
		if err != nil {
			return fail(err)
		}
	}
	return a, cleanup.run, nil
}

// cleanups close what an app opened, the last opened first.
type cleanups []func()

func (c cleanups) run() {
	for _, f := range slices.Backward(c) {
		f()
	}
}

// providerBases sends a connection's API calls to its provider's base URL ("" for API_BASE_URL); a stored
// provider without one is refused, so that its token never goes to another provider's API.
type providerBases struct {
	tokens    *usecase.RefreshTokenUseCase
	providers *provider.Registry
}

func (b providerBases) APIBaseURL(name string) string {
	p, _ := b.providers.Provider(name)
	return p.APIBaseURL
}

func (b providerBases) BaseURL(ctx context.Context, connection string) (string, error) {
	t, err := b.tokens.Token(ctx, connection)
	if err != nil || t.Provider == "" {
		return "", err
	}
	p, ok := b.providers.Provider(t.Provider)
	if !ok {
		return "", fmt.Errorf("provider %q: %w", t.Provider, domain.ErrUnknownProvider)
	}
	if p.APIBaseURL == "" {
		return "", fmt.Errorf("provider %s: %w", t.Provider, domain.ErrNoAPIBaseURL)
	}
	return p.APIBaseURL, nil
}

// newConsole builds srv's operator console on db, a pool of its own, with tokenctl's use cases.
func newConsole(cfg AppConfig, a *app, srv *httpapi.Server, db *gorm.DB, log *slog.Logger) (*console.Console, error) {
	sealer, err := cfg.sealer()
	if err != nil {
		return nil, err
	}
	repo := repository.NewTokenRepository(db, sealer)
	ops := newOperator(cfg.Config, db, repo, repository.NewProviderRepository(db, sealer))
	e := cfg.edges()
	return console.New(console.Deps{
		Keys:        repository.NewKeyCache(repository.NewAPIKeys(db), 0),
		Sessions:    repository.NewConsoleSessions(db),
		Connections: repo,
		History:     repository.NewConnectionEvents(db),
		Actions:     ops,
		Links:       srv,
		Providers:   consoleProviders(cfg, a.tokens.Guard.ProviderRegistry(), repository.NewAuthStyles(db)),
		Secure:      e.PublicURL != nil && e.PublicURL.Scheme == "https",
		Log:         log,
	}), nil
}

// consoleProviders lists the OAUTH_* provider and the stored ones.
func consoleProviders(cfg AppConfig, registry *provider.Registry, styles *repository.AuthStyles) func(context.Context) ([]console.Provider, error) {
	o := cfg.OAuth
	env := domain.Provider{Profile: o.Profile, TokenURL: o.TokenURL, AuthURL: o.AuthURL, RevocationURL: o.RevocationURL,
		APIBaseURL: cfg.APIBaseURL, ClientID: o.ClientID, AuthStyle: domain.AuthStyle(cmp.Or(o.AuthStyle, "auto")), Scopes: o.Scopes,
		Skew: cfg.RefreshSkew, DefaultLifetime: cfg.DefaultLifetime}
	return func(ctx context.Context) ([]console.Provider, error) {
		ps := []domain.Provider{env}
		for _, name := range registry.Names() {
			if sp, ok := registry.Provider(name); ok {
				ps = append(ps, sp)
			}
		}
		out := make([]console.Provider, len(ps))
		for i, p := range ps {
			learned, err := styles.Load(ctx, p.TokenURL, p.ClientID)
			if err != nil {
				return nil, err
			}
			out[i] = console.Provider{Name: p.Name, Profile: p.Profile, TokenURL: p.TokenURL, AuthURL: p.AuthURL, RevokeURL: p.RevocationURL,
				APIBaseURL: p.APIBaseURL, ClientID: p.ClientID, AuthStyle: string(p.AuthStyle), LearnedAuth: learned, Scopes: p.Scopes,
				Skew: p.Skew, Lifetime: p.DefaultLifetime, KeepAlive: p.KeepAlive}
		}
		return out, nil
	}
}
