package repository_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// BenchmarkLockedRotation is a refresh's database work without the
// provider: take the lock with the re-read, write the rotated token,
// commit. pipelined (pgx) against gorm (lib/pq, the same statements one at
// a time in a GORM transaction): the ratio is what the pipeline saves.
//
//	go test -run '^$' -bench LockedRotation ./repository/
func BenchmarkLockedRotation(b *testing.B) {
	if testing.Short() {
		b.Skip("needs Postgres")
	}
	for _, c := range []struct{ name, driver string }{{"pipelined", "pgx"}, {"gorm", "pq"}} {
		b.Run(c.name, func(b *testing.B) {
			r := repository.NewTokenRepository(openDriver(b, testdb.New(b), c.driver), tokencrypt.Plaintext{})
			ctx := context.Background()
			if err := r.Register(ctx, "acme"); err != nil {
				b.Fatal(err)
			}
			err := r.InLock(ctx, "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
				_, err := l.Put(ctx, grantToken("acme", "at", "rt"))
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			g := domain.Grant{AccessToken: domain.NewSecret("at2"), RefreshToken: domain.NewSecret("rt2"), Expiry: time.Now().Add(time.Hour)}
			b.ResetTimer()
			for b.Loop() {
				err := r.InLock(ctx, "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
					cur, err := l.Get(ctx, "acme")
					if err != nil {
						return err
					}
					_, err = l.Save(ctx, cur.Rotated(g, time.Now()))
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
