package di

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// keyring parses TOKEN_ENCRYPTION_KEYS; nil when it is unset or blank.
// Errors name the variable and never show a key.
func (c Config) keyring() (*tokencrypt.Keyring, error) {
	if strings.TrimSpace(string(c.EncryptionKeys)) == "" {
		return nil, nil
	}
	return c.EncryptionKeys.Keyring()
}

// encryptionSummary is what Config.String shows: key ids, never keys.
func encryptionSummary(s tokencrypt.KeySpec) string {
	if strings.TrimSpace(string(s)) == "" {
		return "off"
	}
	k, err := s.Keyring()
	if err != nil {
		return "invalid"
	}
	return "current=" + k.Current()
}

// repositoryOptions are the options every token repository of an app
// built from cfg takes: the keyring, when one is configured.
func repositoryOptions(cfg Config) ([]repository.Option, error) {
	k, err := cfg.keyring()
	if err != nil || k == nil {
		return nil, err
	}
	return []repository.Option{repository.WithSealer(k)}, nil
}

// openSealed is NewTokens' start-up check. It returns the repository
// options for cfg after making sure they open every stored token: a wrong
// or missing key (or encrypted rows with no keys configured) is a start-up
// error naming TOKEN_ENCRYPTION_KEYS and the key id, not a failure at the
// first refresh. It warns when tokens are stored in plaintext, and when
// some still wait for "tokenctl rotate-key".
func openSealed(ctx context.Context, db *gorm.DB, cfg Config, log *slog.Logger) ([]repository.Option, error) {
	opts, err := repositoryOptions(cfg)
	if err != nil {
		return nil, err
	}
	kc, err := repository.NewTokenRepository(db, opts...).CheckKeys(ctx)
	if errors.Is(err, domain.ErrUndecryptable) {
		return nil, fmt.Errorf("%s cannot decrypt the stored tokens: %w", tokencrypt.EnvKeys, err)
	}
	if err != nil {
		return nil, fmt.Errorf("check stored tokens: %w", err)
	}
	if log == nil {
		return opts, nil
	}
	switch {
	case len(opts) == 0:
		log.Warn(tokencrypt.EnvKeys + " is unset: access and refresh tokens are stored in plaintext")
	case kc.Stale > 0:
		log.Warn("some stored tokens are not sealed with the current key; run tokenctl rotate-key",
			slog.Int("rows", kc.Stale))
	}
	return opts, nil
}

// Reseal is "tokenctl rotate-key": it re-encrypts every stored token with
// the current key of TOKEN_ENCRYPTION_KEYS, sealing legacy plaintext rows
// too. Each connection is rewritten in its own short transaction under the
// connection's refresh lock, so running apps keep refreshing meanwhile.
// Every running app must already know the current key (see README,
// "Encryption at rest"). It is safe to run again after a failure.
func Reseal(ctx context.Context, cfg Config, log *slog.Logger) (repository.ResealResult, error) {
	k, err := cfg.keyring()
	if err != nil {
		return repository.ResealResult{}, err
	}
	if k == nil {
		return repository.ResealResult{}, fmt.Errorf("%s is required to rotate keys", tokencrypt.EnvKeys)
	}
	db, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Pool{MaxOpenConns: 2}, log)
	if err != nil {
		return repository.ResealResult{}, err
	}
	defer func() { _ = postgres.Close(db) }()
	res, err := repository.NewTokenRepository(db, repository.WithSealer(k)).Reseal(ctx, repository.DefaultResealBatch, cfg.LockWait)
	if log != nil {
		log.Info("rotate-key", slog.String("current_key", k.Current()),
			slog.Int("resealed", res.Resealed), slog.Int("already_current", res.Current), slog.Bool("complete", err == nil))
	}
	if err != nil {
		return res, fmt.Errorf("rotate-key: %w", err)
	}
	return res, nil
}
