package di

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// hasKeys reports whether TOKEN_ENCRYPTION_KEYS is set, not blank.
func (c Config) hasKeys() bool { return strings.TrimSpace(string(c.EncryptionKeys)) != "" }

// keyring parses TOKEN_ENCRYPTION_KEYS; nil without keys.
func (c Config) keyring() (*tokencrypt.Keyring, error) {
	if !c.hasKeys() {
		return nil, nil
	}
	return c.EncryptionKeys.Keyring()
}

// encryption is what String shows: key ids, never keys.
func (c Config) encryption() string {
	switch k, err := c.keyring(); {
	case err != nil:
		return "invalid"
	case k == nil:
		return "off"
	default:
		return "current=" + k.Current()
	}
}

// sealer seals token values with the keyring, when one is configured.
func (c Config) sealer() (repository.Sealer, error) {
	k, err := c.keyring()
	if err != nil || k == nil {
		return tokencrypt.Plaintext{}, err
	}
	return k, nil
}

// Reseal is "tokenctl rotate-key": it re-encrypts every stored token and provider secret with the current
// key, each connection under its refresh lock, so running apps (which must know the key already) keep
// refreshing. It is safe to run again after a failure.
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
