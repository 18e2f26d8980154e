package di

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/queue"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Store is the token store without the provider, for the operator tools.
type Store struct {
	DB         *gorm.DB
	Repository *repository.TokenRepository
	Connect    *usecase.ConnectUseCase
	Providers  *repository.ProviderRepository
}

// NewStore opens the migrated database, needing no OAuth2 settings; call the cleanup.
func NewStore(ctx context.Context, cfg Config, log *slog.Logger) (*Store, func(), error) {
	sealer, err := cfg.sealer()
	if err != nil {
		return nil, nil, err
	}
	// The tools' locked writes commit as durably as the apps': TOKEN_SYNC_COMMIT, else the cluster's default.
	durability, err := repository.NewDurability(cfg.SyncCommit)
	if err != nil {
		return nil, nil, fmt.Errorf("TOKEN_SYNC_COMMIT: %w", err)
	}
	db, closeDB, err := openDB(ctx, cfg.DatabaseURL, min(cfg.DBMaxConns, 4), log)
	if err != nil {
		return nil, nil, err
	}
	if err := migrated(ctx, db); err != nil {
		closeDB()
		return nil, nil, err
	}
	repo := repository.NewTokenRepository(db, sealer)
	if r, err := repo.ReadReplication(ctx); err == nil {
		durability.Observe(r)
	}
	repo.SetDurability(durability)
	return &Store{
		DB:         db,
		Repository: repo,
		Connect:    usecase.NewConnectUseCase(repo, nil, cfg.LockWait),
		Providers:  repository.NewProviderRepository(db, sealer),
	}, closeDB, nil
}

// migrated refuses an unmigrated database, naming the command that fixes it.
func migrated(ctx context.Context, db *gorm.DB) error {
	var ok bool
	if err := db.WithContext(ctx).Raw("SELECT to_regclass(?) IS NOT NULL", migrations.Table).Scan(&ok).Error; err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	if !ok {
		return configErr("the database has no tokenguard tables yet: run `tokenctl migrate` first")
	}
	return nil
}

// openDB opens a pool of conns connections that logs to log (nil: nowhere); call the cleanup.
func openDB(ctx context.Context, url string, conns int, log *slog.Logger) (*gorm.DB, func(), error) {
	db, err := postgres.Open(ctx, url, postgres.Pool{MaxOpenConns: conns}, repository.NewLogger(cmp.Or(log, discard)))
	if err != nil {
		return nil, nil, err
	}
	return db, func() { _ = postgres.Close(db) }, nil
}

var discard = slog.New(slog.DiscardHandler)

// migrate applies tokenguard's migrations on db, or on MigrateURL when it differs (their session lock would not survive a pooler).
func migrate(ctx context.Context, cfg Config, db *gorm.DB, log *slog.Logger) error {
	if cfg.MigrateURL() == cfg.DatabaseURL {
		return tokenguard.Migrate(ctx, db)
	}
	direct, closeDirect, err := openDB(ctx, cfg.MigrateURL(), 2, log)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer closeDirect()
	return tokenguard.Migrate(ctx, direct)
}

// migrateQueueAt applies River's migrations on a pool of its own at databaseURL.
func migrateQueueAt(ctx context.Context, databaseURL string) error {
	pool, err := queue.OpenPool(ctx, databaseURL, 2)
	if err != nil {
		return fmt.Errorf("migrate queue: %w", err)
	}
	defer pool.Close()
	return queue.Migrate(ctx, pool)
}
