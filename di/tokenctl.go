package di

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// Tokenctl is the operator CLI's backend, configured from environ
// (DATABASE_URL only) when a command first needs the database.
func Tokenctl(environ []string, logTo io.Writer) tokenctl.Backend {
	return tokenctlBackend{environ: environ, logTo: logTo}
}

type tokenctlBackend struct {
	environ []string
	logTo   io.Writer
}

func (b tokenctlBackend) config() (Config, error) {
	cfg, err := ConfigFromEnvChecked(b.environ)
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
	return Migrate(ctx, cfg.DatabaseURL)
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

func (b tokenctlBackend) Open(ctx context.Context) (tokenctl.Store, func(), error) {
	cfg, err := b.config()
	if err != nil {
		return nil, nil, err
	}
	// Database errors reach the operator as tokenctl's one-line message;
	// GORM's own log of them would only repeat it.
	s, cleanup, err := NewStore(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, err
	}
	return ctlStore{s}, cleanup, nil
}

type ctlStore struct{ *Store }

func (s ctlStore) Get(ctx context.Context, id string) (domain.Token, error) {
	return s.Repository.Get(ctx, id)
}

func (s ctlStore) List(ctx context.Context) ([]domain.Token, error) { return s.Repository.List(ctx) }

func (s ctlStore) Connect(ctx context.Context, id string, g domain.Grant) (domain.Token, error) {
	return s.Store.Connect.Connect(ctx, id, g)
}
