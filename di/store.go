package di

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/queue"
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

// NewStore opens the database unmigrated, needing no OAuth2 settings; call the cleanup.
func NewStore(ctx context.Context, cfg Config, log *slog.Logger) (*Store, func(), error) {
	sealer, err := cfg.sealer()
	if err != nil {
		return nil, nil, err
	}
	db, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Pool{MaxOpenConns: min(cfg.DBMaxConns, 4)}, repository.NewLogger(log))
	if err != nil {
		return nil, nil, err
	}
	repo := repository.NewTokenRepository(db, sealer)
	// The tools' locked writes (an import's grant, a reactivation) commit
	// as durably as the apps' do: TOKEN_SYNC_COMMIT, else the cluster's
	// default as read now.
	durability, err := repository.NewDurability(cfg.SyncCommit)
	if err != nil {
		_ = postgres.Close(db)
		return nil, nil, fmt.Errorf("TOKEN_SYNC_COMMIT: %w", err)
	}
	if r, err := repo.ReadReplication(ctx); err == nil {
		durability.Observe(r)
	}
	repo.SetDurability(durability)
	return &Store{
		DB:         db,
		Repository: repo,
		Connect:    usecase.NewConnectUseCase(repo, nil, cfg.LockWait),
		Providers:  repository.NewProviderRepository(db, sealer),
	}, func() { _ = postgres.Close(db) }, nil
}

// Migrate applies tokenguard's migrations and then River's.
func Migrate(ctx context.Context, databaseURL string) error {
	db, err := postgres.Open(ctx, databaseURL, postgres.Pool{MaxOpenConns: 2}, nil)
	if err != nil {
		return err
	}
	err = tokenguard.Migrate(ctx, db)
	_ = postgres.Close(db)
	if err != nil {
		return err
	}
	return migrateQueueAt(ctx, databaseURL)
}

// migrateQueue is migrate for River's migrations.
func migrateQueue(ctx context.Context, cfg Config, pool *pgxpool.Pool) error {
	if cfg.MigrateURL() == cfg.DatabaseURL {
		return queue.Migrate(ctx, pool)
	}
	return migrateQueueAt(ctx, cfg.MigrateURL())
}

// migrateQueueAt applies River's migrations on a pool of its own.
func migrateQueueAt(ctx context.Context, databaseURL string) error {
	pool, err := queue.OpenPool(ctx, databaseURL, 2)
	if err != nil {
		return fmt.Errorf("migrate queue: %w", err)
	}
	defer pool.Close()
	return queue.Migrate(ctx, pool)
}
