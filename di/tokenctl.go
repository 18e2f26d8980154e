package di

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// RunTokenctl runs the operator CLI and returns its exit status.
func RunTokenctl(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Only check needs the client secret.
	for _, w := range envWarnings(environ, len(args) > 0 && args[0] == "check") {
		fmt.Fprintf(stderr, "tokenctl: warning: %s\n", w.Message)
	}
	code := tokenctl.Main(args, Tokenctl(environ, stderr), tokenctl.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if code == 0 && (HelpAsked(args) || args[0] == "help") {
		PrintEnv(stderr, Config{}, false)
	}
	return code
}

// Tokenctl is the operator CLI's backend, configured from environ when a command needs it.
func Tokenctl(environ []string, logTo io.Writer) tokenctl.Backend {
	return tokenctlBackend{environ: environ, logTo: logTo}
}

type tokenctlBackend struct {
	environ []string
	logTo   io.Writer
}

func (b tokenctlBackend) Migrate(ctx context.Context) error {
	cfg, err := ConfigFromEnv(b.environ)
	if err != nil {
		return err
	}
	db, closeDB, err := openDB(ctx, cfg.MigrateURL(), 2, nil)
	if err != nil {
		return err
	}
	err = tokenguard.Migrate(ctx, db) // then River's
	closeDB()
	if err != nil {
		return err
	}
	return migrateQueueAt(ctx, cfg.MigrateURL())
}

func (b tokenctlBackend) RotateKey(ctx context.Context) (int, int, error) {
	cfg, err := ConfigFromEnv(b.environ)
	if err != nil {
		return 0, 0, err
	}
	res, err := Reseal(ctx, cfg, NewLogger(b.logTo, "warn", "text").With("app", "tokenctl"))
	return res.Resealed, res.Current, err
}

func (b tokenctlBackend) Check(ctx context.Context) (provider.CheckResult, error) {
	cfg, err := ConfigFromEnv(b.environ)
	if err == nil {
		err = cfg.RequireOAuth()
	}
	if err != nil {
		return provider.CheckResult{}, err
	}
	return checkEndpoint(ctx, cfg, agentClient(10*time.Second, "tokenctl")), nil
}

func (b tokenctlBackend) Open(ctx context.Context) (*tokenctl.Stores, func(), error) {
	cfg, err := ConfigFromEnv(b.environ)
	if err != nil {
		return nil, nil, err
	}
	s, cleanup, err := NewStore(ctx, cfg, discard)
	if err != nil {
		return nil, nil, err
	}
	ops := newOperator(cfg, s.DB, s.Repository, s.Providers)
	return &tokenctl.Stores{Connections: ctlStore{ops, s, cfg}, ExpiringNotice: cfg.ExpiringNotice, Keys: repository.NewAPIKeys(s.DB),
		Providers: s.Providers, Encrypted: cfg.hasKeys(), AllowInsecureURLs: cfg.AllowInsecureURLs}, cleanup, nil
}

// operator makes the operator's changes to connections, for tokenctl and the console alike.
type operator struct {
	*repository.TokenRepository // Connection, EachConnection, NeedingReauth
	disconnect                  *usecase.DisconnectUseCase
	lockWait                    time.Duration
}

// newOperator revokes at each connection's provider's revocation endpoint, authenticated as at its token endpoint.
func newOperator(cfg Config, db *gorm.DB, repo *repository.TokenRepository, providers *repository.ProviderRepository) operator {
	client := provider.NewHTTPClient(min(cfg.RefreshTimeout, usecase.DefaultRevokeTimeout))
	prof, _ := profiles.Get(cfg.OAuth.Profile) // generic when unknown
	revoker := provider.NewRevoker(OAuth2Config(cfg.OAuth), cfg.OAuth.RevocationURL, cfg.OAuth.key, prof, providers,
		provider.NewDiscovery(client), client, repository.NewAuthStyles(db))
	return operator{repo, usecase.NewDisconnectUseCase(repo, revoker, cfg.LockWait, cfg.RefreshTimeout), cfg.LockWait}
}

func (o operator) Disconnect(ctx context.Context, connection string, revoke bool) (domain.Token, error) {
	return o.disconnect.Disconnect(ctx, connection, revoke)
}

func (o operator) Reactivate(ctx context.Context, connection, reason string) (domain.Token, int64, error) {
	if err := domain.ValidateName(connection); err != nil {
		return domain.Token{}, 0, err
	}
	return o.TokenRepository.Reactivate(ctx, connection, reason, o.lockWait)
}

// ctlStore is tokenctl's Store.
type ctlStore struct {
	operator
	store *Store
	cfg   Config
}

// Connect stores an imported grant (see tokenctl.Store); one without an expiry gets its provider's default lifetime.
func (s ctlStore) Connect(ctx context.Context, id, provider string, g domain.Grant, metadata *domain.Metadata, key domain.Secret, jkt string) (domain.Token, error) {
	if g.Expiry.IsZero() {
		lifetime := s.cfg.DefaultLifetime
		if provider != "" {
			if p, err := s.store.Providers.Get(ctx, provider); err == nil {
				lifetime = cmp.Or(p.DefaultLifetime, lifetime)
			}
		} else if prof, err := profiles.Get(s.cfg.OAuth.Profile); err == nil && lifetime == 0 && prof.AccessLifetime.Known {
			lifetime = prof.AccessLifetime.D
		}
		if lifetime > 0 {
			g.Expiry = time.Now().Add(lifetime)
		}
	}
	return s.store.Connect.ConnectGrant(ctx, id, g, usecase.ConnectRequest{AllowAccountChange: true, Provider: provider, Metadata: metadata,
		DPoPKey: key, DPoPJKT: jkt})
}

// Reseal is "tokenctl rotate-key": it re-encrypts every stored token (under its refresh lock, so running apps
// that know the key keep refreshing) and provider secret with the current key; it may be run again after a failure.
func Reseal(ctx context.Context, cfg Config, log *slog.Logger) (repository.ResealResult, error) {
	log = cmp.Or(log, discard)
	k, err := cfg.keyring()
	if err != nil {
		return repository.ResealResult{}, err
	}
	if k == nil {
		return repository.ResealResult{}, configErr("%s is required to rotate keys", tokencrypt.EnvKeys)
	}
	s, closeStore, err := NewStore(ctx, cfg, log)
	if err != nil {
		return repository.ResealResult{}, err
	}
	defer closeStore()
	res, err := s.Repository.Reseal(ctx, repository.DefaultResealBatch, cfg.LockWait)
	if err == nil {
		var resealed, current int
		resealed, current, err = s.Providers.Reseal(ctx)
		log.Info("rotate-key: provider client secrets", slog.Int("resealed", resealed), slog.Int("already_current", current))
	}
	log.Info("rotate-key", slog.String("current_key", k.Current()),
		slog.Int("resealed", res.Resealed), slog.Int("already_current", res.Current), slog.Bool("complete", err == nil),
		slog.Bool("only_bound_form_from_now_on", res.OnlyBound))
	if err != nil {
		return res, fmt.Errorf("rotate-key: %w", err)
	}
	return res, nil
}
