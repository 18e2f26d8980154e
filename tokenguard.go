// Package tokenguard lets several processes share OAuth2 connections stored
// in Postgres, on the application's own *gorm.DB: one caller fleet-wide
// refreshes a nearly expired token under a Postgres advisory lock, and
// stores the rotated refresh token in that transaction.
//
//	err := tokenguard.Migrate(ctx, db)         // db: the application's *gorm.DB
//	tokens, err := tokenguard.New(db, oauthConfig)
//	go tokens.Run(ctx)                         // the cache, kept right across processes
//	defer tokens.Close(context.Background())   // on shutdown, before the pool closes
//	resp, err := tokens.Client(ctx, "acme").Get(apiURL)
//
// tokenguard's tables live in the *gorm.DB's current schema (see search_path).
package tokenguard

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/infra/tracing"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Migrate creates or updates tokenguard's tables in db's current schema
// (ErrSchemaNotFound if it is missing). Concurrent migrations wait for each
// other; tables of older releases stay readable behind views.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if err := checkDB(db); err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("tokenguard: migrate: %w", err)
	}
	if err := migrations.UpDB(ctx, sqlDB); err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	return nil
}

// Tokens hands out the connections' access tokens. It is safe for
// concurrent use; make one per process and share it.
type Tokens struct {
	uc         *usecase.RefreshTokenUseCase
	connect    *usecase.ConnectUseCase
	repo       *repository.TokenRepository
	disconnect *usecase.DisconnectUseCase
	o          options         // as New completed them (Logger, Skew, LockWait, cfg's DPoP, resource, PAR, user info)
	metrics    Metrics         // nil without prom.WithMetrics
	listen     *pgx.ConnConfig // where Run listens
	db         *gorm.DB        // tokenguard's statements; Run's heartbeat
	clock      *repository.DatabaseClock
	providers  *provider.Registry // follows the stored providers while Run runs
	cfg        *oauth2.Config     // the client of connections that name no provider
	flow       *usecase.ConnectFlowUseCase
	httpClient *http.Client
	nonces     *dpop.Nonces        // the DPoP nonces servers gave this process
	dpopKeys   sync.Map            // opened DPoP keys
	clientKey  *clientkey.Key      // cfg's private_key_jwt key, if any
	discovery  *provider.Discovery // the providers' metadata (PAR, the issuer)

	running atomic.Bool // Run is running
	closed  atomic.Bool

	ready     chan struct{} // closed once Run has made the cache live
	readyOnce sync.Once
	runOnce   sync.Once
	runErr    error         // why Run returned early, for WaitReady
	runDone   chan struct{} // closed when a Run that never made the cache live returned
}

// New builds the token layer on the application's migrated *gorm.DB as
// gorm.Open returns it (not a transaction); cfg is the client registration.
// With AuthStyleAutoDetect the other style is tried only after the provider
// refuses the client, so a refresh token is never presented twice. New fails
// on ErrSchemaNotFound, ErrReadOnlyStore and undecryptable stored tokens.
func New(db *gorm.DB, cfg *oauth2.Config, opts ...Option) (*Tokens, error) {
	if err := checkDB(db); err != nil {
		return nil, err
	}
	o := options{Options: usecase.Options{Skew: usecase.DefaultSkew, LockWait: usecase.DefaultLockWait}, profileParams: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	cfg, prof, envLifetime, err := applyProfile(cfg, &o)
	if err != nil {
		return nil, err
	}
	if cfg == nil || cfg.Endpoint.TokenURL == "" {
		return nil, errors.New("tokenguard: the oauth2.Config has no Endpoint.TokenURL")
	}
	pool, err := poolOf(db)
	if err != nil {
		return nil, err
	}
	listen, err := listenConfig(db, o.listenDSN)
	if err != nil {
		return nil, err
	}
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.RefreshTimeout = cmp.Or(o.RefreshTimeout, min(usecase.DefaultRefreshTimeout, o.LockWait*2/3))
	o.AnswerDeadline = cmp.Or(o.AnswerDeadline, max(usecase.DefaultAnswerDeadline, o.RefreshTimeout))
	envRate, err := domain.ParseTokenRate(o.tokenRate)
	if err != nil {
		return nil, fmt.Errorf("tokenguard: WithTokenRate: %w", err)
	}
	if o.par, err = domain.ParsePARMode(string(o.par)); err != nil {
		return nil, fmt.Errorf("tokenguard: WithPAR: %w", err)
	}
	sealer, err := o.sealer()
	if err != nil {
		return nil, err
	}
	t := &Tokens{o: o, listen: listen, ready: make(chan struct{}), runDone: make(chan struct{}), nonces: &dpop.Nonces{}, cfg: cfg}
	if o.clientKey != nil {
		if t.clientKey, err = clientkey.FromSigner(o.clientKey); err != nil {
			return nil, fmt.Errorf("tokenguard: WithClientKey: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := t.openStore(ctx, pool, sealer, envRate); err != nil {
		return nil, err
	}
	if err := t.build(ctx, sealer, prof, envLifetime, envRate); err != nil {
		return nil, err
	}
	var attrs []any
	if lone := t.observeReplication(ctx, true); lone != "" {
		attrs = append(attrs, slog.String("replication", lone))
	}
	o.Logger.Info("tokenguard: ready; the token cache is bypassed until Run is running (every call reads the database)", attrs...)
	return t, nil
}

// sealer seals the stored tokens with o's keys, or leaves them plaintext.
func (o options) sealer() (repository.Sealer, error) {
	if o.keys == "" {
		if o.encryptionRequired {
			return nil, errors.New("tokenguard: WithEncryptionRequired needs WithEncryptionKeys")
		}
		return tokencrypt.Plaintext{}, nil
	}
	k, err := tokencrypt.ParseKeyring(o.keys)
	if err != nil {
		return nil, fmt.Errorf("tokenguard: WithEncryptionKeys: %w", err)
	}
	if o.encryptionRequired {
		k = k.RequireSealed()
	}
	return k, nil
}

// openStore opens t's store on pool, checks the search path, the primary and
// the keys, and starts the database clock.
func (t *Tokens) openStore(ctx context.Context, pool gorm.ConnPool, sealer repository.Sealer, envRate domain.TokenRate) error {
	// A *gorm.DB of tokenguard's own: no PrepareStmt cache, none of the application's
	// plugins (which could record tokens), a logger that never prints a token.
	rdb, err := gorm.Open(gormpostgres.New(gormpostgres.Config{Conn: pool}),
		&gorm.Config{Logger: repository.NewLogger(t.o.Logger), SkipDefaultTransaction: true})
	if err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	t.db, t.repo = rdb, repository.NewTokenRepository(rdb, sealer)
	durability, err := repository.NewDurability(t.o.syncCommit)
	if err != nil {
		return fmt.Errorf("tokenguard: WithSyncCommit: %w", err)
	}
	t.repo.SetDurability(durability)
	t.repo.SetTokenRate(envRate)
	t.repo.OnRotationWrittenBack(t.writtenBack)
	if err := migrations.CheckSearchPath(ctx, pool); err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	if err := t.repo.CheckPrimary(ctx); err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	kc, err := t.repo.CheckKeys(ctx)
	switch {
	case errors.Is(err, domain.ErrUndecryptable):
		return fmt.Errorf("tokenguard: the encryption keys cannot decrypt the stored tokens: %w", err)
	case err != nil:
		return fmt.Errorf("tokenguard: read the stored tokens (has Migrate run?): %w", err)
	case t.o.keys == "":
		t.o.Logger.Warn("tokenguard: access and refresh tokens are stored in plaintext (see WithEncryptionKeys)")
	case kc.Stale > 0:
		t.o.Logger.Warn("tokenguard: some stored tokens are not sealed with the current key; re-encrypt them (tokenctl rotate-key)",
			slog.Int("rows", kc.Stale))
	}
	// Staleness is decided on the database server's clock, whatever the hosts' drift.
	if t.clock, err = repository.NewDatabaseClock(ctx, rdb, nil); err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	if off := t.clock.Offset(); off.Abs() > time.Second {
		t.o.Logger.Warn("tokenguard: this host's clock is off from the database server's; tokenguard uses the server's",
			slog.Duration("offset", off.Round(time.Millisecond)))
	}
	return nil
}

// build makes the refreshers of t.cfg (profile prof) and of the stored
// providers, and the use cases on them.
func (t *Tokens) build(ctx context.Context, sealer repository.Sealer, prof profiles.Profile, envLifetime time.Duration, envRate domain.TokenRate) error {
	o := t.o
	// The token endpoint's requests show in the refresh's trace.
	t.httpClient = tracing.Client(cmp.Or(o.httpClient, provider.NewHTTPClient(o.AnswerDeadline)), o.tracerProvider)
	t.discovery = provider.NewDiscovery(t.httpClient)
	t.o.userInfo.HTTP = t.httpClient
	stored, authStyles := repository.NewProviderRepository(t.db, sealer), repository.NewAuthStyles(t.db)
	refresherOf := func(cfg *oauth2.Config, defaultLifetime time.Duration, prof profiles.Profile, rate domain.TokenRate, extra ...provider.Option) provider.GrantRefresher {
		pol := provider.PolicyFor(prof, o.Logger)
		// Answered failures are retried within the refresh timeout; each request's answer is awaited
		// for the answer deadline (the use case's call lasts both).
		pol.RetryWithin, pol.AnswerWithin = o.RefreshTimeout, o.AnswerDeadline
		if !rate.IsZero() {
			pol.MaxAttempts = 1 // each request is debited from the budget: none is resent within a call
		}
		return provider.NewRetrying(provider.NewRefresher(cfg, t.httpClient, append([]provider.Option{
			provider.WithAuthStyleStore(authStyles), provider.WithProfile(prof),
			provider.WithEvidence(repository.NewRefusalEvidence(t.db), provider.AllEvidence),
			provider.WithDefaultLifetime(defaultLifetime), provider.WithLogger(o.Logger), provider.WithClock(t.clock.Now),
			provider.WithNonces(t.nonces)}, extra...)...), pol)
	}
	envAuth := provider.ClientOptions(o.resource, t.clientKey, prof, t.discovery)
	t.providers = provider.NewRegistry(refresherOf(t.cfg, envLifetime, prof, envRate, envAuth...), stored,
		func(p domain.Provider) provider.GrantRefresher {
			pp, err := profiles.Get(p.Profile)
			if err != nil {
				// Added by a newer release whose catalog this one lacks.
				o.Logger.Warn("tokenguard: a stored provider names a profile this release does not know; the generic behaviour applies",
					slog.String("provider", p.Name), slog.String("profile", p.Profile))
			}
			return refresherOf(provider.OAuth2Config(p), cmp.Or(p.DefaultLifetime, o.defaultLifetime), pp, p.TokenRate, provider.StoredClientOptions(p, pp, t.discovery)...)
		}, o.Logger)
	t.providers.SetProfile(prof)
	if err := t.providers.Load(ctx); err != nil {
		if errors.Is(err, domain.ErrUndecryptable) {
			return fmt.Errorf("tokenguard: the encryption keys cannot decrypt a stored provider's client secret: %w", err)
		}
		return fmt.Errorf("tokenguard: %w", err)
	}

	uopts := o.Options
	uopts.Clock, uopts.Tracer = t.clock, tracing.New(o.tracerProvider)
	uopts.ProviderSkew, uopts.ProviderKeepAlives = t.providers.Skew, t.providers.KeepAlives
	if o.metrics != nil {
		t.metrics = o.metrics(t.repo, o.connectionLabel, o.Logger)
		uopts.Observer = t.metrics
	}
	var err error
	if t.uc, err = usecase.NewRefreshTokenUseCase(t.repo, t.providers, uopts); err != nil {
		return fmt.Errorf("tokenguard: %w", err)
	}
	t.providers.OnChange(t.uc.ProviderChanged)
	t.uc.OnRolledBack(t.rolledBack)
	t.connect = usecase.NewConnectUseCase(t.repo, t.clock, o.LockWait)
	revoker := provider.NewRevoker(t.cfg, o.revocationURL, t.clientKey, prof, stored,
		t.discovery, provider.NewHTTPClient(o.RefreshTimeout), authStyles)
	t.disconnect = usecase.NewDisconnectUseCase(t.repo, revoker, o.LockWait, o.RefreshTimeout)
	t.flow = usecase.NewConnectFlowUseCase(repository.NewConnectResults(t.db, sealer), t.connect, revoker, o.RefreshTimeout, o.Logger)
	return nil
}

// checkDB rejects a *gorm.DB tokenguard cannot work with.
func checkDB(db *gorm.DB) error {
	if db == nil {
		return errors.New("tokenguard: nil *gorm.DB")
	}
	if name := db.Dialector.Name(); name != "postgres" {
		return fmt.Errorf("tokenguard: needs Postgres, and this *gorm.DB is %q: the refresh lock is a Postgres advisory lock", name)
	}
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		return errors.New("tokenguard: this *gorm.DB is bound to a transaction; pass the one gorm.Open returned: tokenguard commits its own transactions, so that a rotated token never waits for yours")
	}
	return nil
}

// poolOf is the pool under db, unwrapped from a PrepareStmt cache, whose
// mutex deadlocks with the pool exhausted (go-gorm/gorm#7465).
func poolOf(db *gorm.DB) (gorm.ConnPool, error) {
	pool := db.Statement.ConnPool
	if p, ok := pool.(*gorm.PreparedStmtDB); ok {
		pool = p.ConnPool
	}
	if _, ok := pool.(interface {
		Conn(context.Context) (*sql.Conn, error)
	}); !ok {
		return nil, fmt.Errorf("tokenguard: the *gorm.DB's pool is a %T, not a *sql.DB", pool)
	}
	return pool, nil
}

// Token returns connection's access token, valid for at least the skew,
// refreshed first if due (at most once per expiry fleet-wide). Its Expiry is
// the provider's minus the skew, so that an oauth2.ReuseTokenSource never
// keeps it past another process's refresh. Errors wrap an Err* or ctx's error.
func (t *Tokens) Token(ctx context.Context, connection string) (*oauth2.Token, error) {
	c, err := t.Credential(ctx, connection)
	if err != nil {
		return nil, err
	}
	if c.DPoPJKT != "" {
		return nil, fmt.Errorf("token of %s: %w", connection, ErrSenderConstrained)
	}
	return c.Token, nil
}

// TokenSource is connection's oauth2.TokenSource (Tokens.Token with ctx). Prefer Client
// for HTTP: it recovers a 401 caused by another process's refresh, oauth2.NewClient cannot.
func (t *Tokens) TokenSource(ctx context.Context, connection string) oauth2.TokenSource {
	return tokenSource(func() (*oauth2.Token, error) { return t.Token(ctx, connection) })
}

type tokenSource func() (*oauth2.Token, error)

func (f tokenSource) Token() (*oauth2.Token, error) { return f() }

// Client returns an *http.Client whose requests carry connection's access
// token; on a 401 it gets a newer token and resends a replayable request
// once. Its base transport is ctx's oauth2.HTTPClient's, else the default.
// It never follows redirects: that would send the token wherever they point.
func (t *Tokens) Client(ctx context.Context, connection string) *http.Client {
	return apiclient.NewHTTPClient(ctx, apiTokens{t}, connection)
}

// apiTokens is the use case as Client's transport needs it, refusing calls after Close.
type apiTokens struct{ t *Tokens }

func (a apiTokens) Token(ctx context.Context, connection string) (domain.Token, error) {
	if a.t.closed.Load() {
		return domain.Token{}, ErrClosed
	}
	return a.t.uc.Token(ctx, connection)
}

func (a apiTokens) ForceRefresh(ctx context.Context, connection string, failed int64) (domain.Token, error) {
	if a.t.closed.Load() {
		return domain.Token{}, ErrClosed
	}
	return a.t.uc.ForceRefresh(ctx, connection, failed)
}

// Import stores tok, a new grant with an access and a refresh token, as
// connection's (created or made active again) after any refresh in progress;
// its metadata stays unless WithMetadata is given.
func (t *Tokens) Import(ctx context.Context, connection string, tok *oauth2.Token, opts ...ImportOption) error {
	if t.closed.Load() {
		return ErrClosed
	}
	if tok == nil {
		return fmt.Errorf("import %s: %w: nil token", connection, ErrInvalidToken)
	}
	r := usecase.ConnectRequest{AllowAccountChange: true}
	for _, opt := range opts {
		if err := opt(&r); err != nil {
			return fmt.Errorf("import %s: %w", connection, err)
		}
	}
	_, err := t.connect.ConnectGrant(ctx, connection, provider.GrantFrom(tok), r)
	return err
}

// Run turns the cache on and keeps it right across processes by listening for
// the token changes every process commits; the cache is trusted only while a
// heartbeat comes back. Run reconnects by itself and returns nil when ctx ends.
func (t *Tokens) Run(ctx context.Context) error {
	if !t.running.CompareAndSwap(false, true) {
		return errors.New("tokenguard: Run is running already")
	}
	defer t.running.Store(false)
	go t.clock.Run(ctx, 5*time.Minute) // measures the host clock's offset again
	err := repository.NewConfigChangeListener(t.listen, cacheState{ChangeTarget: t.uc, t: t}, t.o.Logger).WithHeartbeat(t.db, repository.DefaultHeartbeat).
		OnProviderChange(t.providers.Changed).OnConnect(func(ctx context.Context) { t.observeReplication(ctx, false) }).Run(ctx)
	t.runOnce.Do(func() { // for WaitReady
		t.runErr = cmp.Or(err, errors.New("tokenguard: Run returned (its context ended) before the cache was live"))
		close(t.runDone)
	})
	return err
}

// Ready is closed once Run has made the cache live: from then on a cached
// token is served without a query.
func (t *Tokens) Ready() <-chan struct{} { return t.ready }

// WaitReady waits until Ready, and returns nil, ctx's error, or why Run
// returned before the cache was live. Calls need not wait.
func (t *Tokens) WaitReady(ctx context.Context) error {
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.runDone: // runErr is written before runDone closes
		select {
		case <-t.ready:
			return nil
		default:
			return t.runErr
		}
	}
}

// cacheState passes the listener's calls on, and records whether the cache is trusted.
type cacheState struct {
	repository.ChangeTarget
	t *Tokens
}

func (c cacheState) TrustCache(trusted bool) {
	c.ChangeTarget.TrustCache(trusted)
	if trusted {
		c.t.readyOnce.Do(func() { close(c.t.ready) })
	}
	if c.t.metrics != nil {
		c.t.metrics.ListenerConnected(trusted)
	}
}

// Close refuses new calls (ErrClosed) and waits, bounded by ctx, for the calls
// in flight. A refresh outlives its callers, since the provider may have rotated
// the refresh token: close before the pool, or a deploy can lose the connection.
func (t *Tokens) Close(ctx context.Context) error {
	t.closed.Store(true)
	if err := t.uc.Drain(ctx); err != nil {
		return fmt.Errorf("tokenguard: close with refreshes still in flight: %w", err)
	}
	return nil
}

// UseCase is the refresh use case under t, for the bundled apps.
func (t *Tokens) UseCase() *usecase.RefreshTokenUseCase { return t.uc }

// ProviderRegistry is the stored providers, for the bundled apps.
func (t *Tokens) ProviderRegistry() *provider.Registry { return t.providers }

// Repository is the store t reads and writes, for the bundled apps.
func (t *Tokens) Repository() *repository.TokenRepository { return t.repo }

// ConnectUseCase stores new grants under t's locks, for the bundled apps.
func (t *Tokens) ConnectUseCase() *usecase.ConnectUseCase { return t.connect }
