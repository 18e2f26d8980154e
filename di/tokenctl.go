package di

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
	"github.com/tokenguard/tokenguard/migrations"
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

func (b tokenctlBackend) config() (Config, error) {
	cfg, err := ConfigFromEnv(b.environ)
	if err != nil {
		return Config{}, &tokenctl.ConfigError{Err: err}
	}
	return cfg, nil
}

func (b tokenctlBackend) Migrate(ctx context.Context) error {
	cfg, err := b.config()
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
	cfg, err := b.config()
	if err != nil {
		return 0, 0, err
	}
	if cfg.EncryptionKeys == "" {
		return 0, 0, &tokenctl.ConfigError{Err: errors.New("TOKEN_ENCRYPTION_KEYS is required for rotate-key")}
	}
	res, err := Reseal(ctx, cfg, NewLogger(b.logTo, "warn", "text").With("app", "tokenctl"))
	return res.Resealed, res.Current, err
}

func (b tokenctlBackend) Open(ctx context.Context, group string) (*tokenctl.Stores, func(), error) {
	cfg, err := b.config()
	if err != nil {
		return nil, nil, err
	}
	switch group {
	case "apikey":
		db, cleanup, err := openMigrated(ctx, cfg, nil)
		if err != nil {
			return nil, nil, err
		}
		return &tokenctl.Stores{Keys: repository.NewAPIKeys(db)}, cleanup, nil
	case "provider":
		sealer, err := cfg.sealer()
		if err != nil {
			return nil, nil, &tokenctl.ConfigError{Err: err}
		}
		db, cleanup, err := openMigrated(ctx, cfg, nil)
		if err != nil {
			return nil, nil, err
		}
		_, plaintext := sealer.(tokencrypt.Plaintext)
		return &tokenctl.Stores{Providers: repository.NewProviderRepository(db, sealer), Encrypted: !plaintext,
			AllowInsecureURLs: cfg.AllowInsecureURLs}, cleanup, nil
	}
	s, cleanup, err := NewStore(ctx, cfg, discard)
	if err != nil {
		return nil, nil, err
	}
	if err := migrated(ctx, s.DB); err != nil {
		cleanup()
		return nil, nil, err
	}
	ops, err := newOperator(cfg, s.DB, s.Repository, s.Providers)
	if err != nil {
		cleanup()
		return nil, nil, &tokenctl.ConfigError{Err: err}
	}
	return &tokenctl.Stores{Connections: ctlStore{ops, s, cfg}, ExpiringNotice: cfg.ExpiringNotice}, cleanup, nil
}

// migrated refuses an unmigrated database, naming the command that fixes it.
func migrated(ctx context.Context, db *gorm.DB) error {
	var ok bool
	if err := db.WithContext(ctx).Raw("SELECT to_regclass(?) IS NOT NULL", migrations.Table).Scan(&ok).Error; err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	if !ok {
		return &tokenctl.ConfigError{Err: errors.New("the database has no tokenguard tables yet: run `tokenctl migrate` first")}
	}
	return nil
}

// openMigrated opens a small pool on a migrated database.
func openMigrated(ctx context.Context, cfg Config, log *slog.Logger) (*gorm.DB, func(), error) {
	db, closeDB, err := openDB(ctx, cfg.DatabaseURL, 2, log)
	if err != nil {
		return nil, nil, err
	}
	if err := migrated(ctx, db); err != nil {
		closeDB()
		return nil, nil, err
	}
	return db, closeDB, nil
}

// operator makes the operator's changes to connections, for tokenctl and the console alike.
type operator struct {
	*repository.TokenRepository // Connection, EachConnection, NeedingReauth
	disconnect                  *usecase.DisconnectUseCase
	lockWait                    time.Duration
}

func newOperator(cfg Config, db *gorm.DB, repo *repository.TokenRepository, providers *repository.ProviderRepository) (operator, error) {
	revoker, err := NewRevoker(cfg, db, providers)
	if err != nil {
		return operator{}, err
	}
	return operator{repo, usecase.NewDisconnectUseCase(repo, revoker, cfg.LockWait, cfg.RefreshTimeout), cfg.LockWait}, nil
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

// Connect stores an imported grant, bound to the DPoP key (PEM, thumbprint jkt) if any. A
// grant without an expiry gets its provider's default lifetime.
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
