package repository

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// ProviderChannel is where a trigger announces each committed provider change, by name (no secret).
const ProviderChannel = "tokenguard_provider_changed"

// ProviderRepository stores the OAuth2 client registrations connections may name. The client
// secret is sealed, bound to the provider's name, and never leaves this package in an error.
type ProviderRepository struct {
	db     *gorm.DB
	sealer Sealer
}

// NewProviderRepository binds the repository to a pool; s seals client secrets (tokencrypt.Plaintext: as they are).
func NewProviderRepository(db *gorm.DB, s Sealer) *ProviderRepository {
	if s == nil {
		panic("repository: nil Sealer (tokencrypt.Plaintext stores secrets as they are)")
	}
	return &ProviderRepository{db: db, sealer: s}
}

// providerAAD binds a sealed client secret or key to its provider and column; ':' cannot be in
// a name, so it never equals a token's additional data.
func providerAAD(name, column string) string { return "provider:" + name + "/" + column }

// providerRow is the tokenguard_providers table as read.
type providerRow struct {
	Name              string
	TokenURL          string
	AuthURL           string
	RevocationURL     string
	APIBaseURL        string
	ClientID          string
	ClientSecret      string
	AuthStyle         string
	Scopes            string // space-separated
	SkewMs            sql.NullInt64
	DefaultLifetimeMs sql.NullInt64
	KeepAliveMs       sql.NullInt64
	Profile           string
	Version           int64
	CreatedAt         time.Time
	UpdatedAt         time.Time
	DPoP              bool `gorm:"column:dpop"`
	Resource          string
	Par               string
	ClientKey         sql.NullString
	TokenRateLimit    sql.NullInt64
	TokenRatePeriodMs sql.NullInt64
}

const selectProvider = `SELECT ` + providerColumns + ` FROM tokenguard_providers`

const providerColumns = `name, token_url, auth_url, revocation_url, api_base_url, client_id, client_secret,
       auth_style, coalesce(array_to_string(scopes, ' '), '') AS scopes,
       skew_ms, default_lifetime_ms, keep_alive_ms, profile, version, created_at, updated_at,
       coalesce(dpop, false) AS dpop, coalesce(resource, '') AS resource, coalesce(par, '') AS par, client_key, token_rate_limit, token_rate_period_ms`

// providerWritten are the columns Add and Update write: written's values through providerValues.
const providerWritten = `token_url, auth_url, revocation_url, api_base_url, client_id, client_secret, auth_style, scopes,
    skew_ms, default_lifetime_ms, keep_alive_ms, profile, dpop, resource, par, client_key, token_rate_limit, token_rate_period_ms`

const providerValues = `?, ?, ?, ?, ?, ?, ?, ?::text[], ?, ?, ?, ?, NULLIF(?, false), NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?`

// written validates p and returns what it stores in providerWritten: its client secret and key
// (none: NULL) sealed.
func (r *ProviderRepository) written(p domain.Provider) ([]any, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	secret, err := r.sealer.Seal(p.ClientSecret.Reveal(), providerAAD(p.Name, "client_secret"))
	if err != nil {
		return nil, fmt.Errorf("seal client secret of provider %s: %w", p.Name, err)
	}
	var key sql.NullString
	if !p.ClientKey.IsZero() {
		if key.String, err = r.sealer.Seal(p.ClientKey.Reveal(), providerAAD(p.Name, "client_key")); err != nil {
			return nil, fmt.Errorf("seal client key of provider %s: %w", p.Name, err)
		}
		key.Valid = true
	}
	rated := !p.TokenRate.IsZero() // no token budget: NULL
	return []any{p.TokenURL, p.AuthURL, p.RevocationURL, p.APIBaseURL, p.ClientID, secret, string(p.AuthStyle),
		textArray(strings.Join(p.Scopes, " ")), nullMillis(p.Skew), nullMillis(p.DefaultLifetime), nullMillis(p.KeepAlive),
		p.Profile, p.DPoP, p.Resource, string(p.PAR), key,
		sql.NullInt64{Int64: int64(p.TokenRate.Limit), Valid: rated}, sql.NullInt64{Int64: p.TokenRate.Period.Milliseconds(), Valid: rated}}, nil
}

func (r providerRow) domain(s Sealer) (domain.Provider, error) {
	secret, err := s.Open(r.ClientSecret, providerAAD(r.Name, "client_secret"))
	if err != nil {
		return domain.Provider{}, fmt.Errorf("client secret of provider %s: %w", r.Name, err)
	}
	var key domain.Secret
	if r.ClientKey.Valid {
		pem, err := s.Open(r.ClientKey.String, providerAAD(r.Name, "client_key"))
		if err != nil {
			return domain.Provider{}, fmt.Errorf("client key of provider %s: %w", r.Name, err)
		}
		key = domain.NewSecret(pem)
	}
	var rate domain.TokenRate // NULL: none
	if r.TokenRateLimit.Valid && r.TokenRatePeriodMs.Valid {
		rate = domain.TokenRate{Limit: int(r.TokenRateLimit.Int64), Period: millis(r.TokenRatePeriodMs)}
	}
	return domain.Provider{
		Name:            r.Name,
		TokenURL:        r.TokenURL,
		AuthURL:         r.AuthURL,
		RevocationURL:   r.RevocationURL,
		APIBaseURL:      r.APIBaseURL,
		ClientID:        r.ClientID,
		ClientSecret:    domain.NewSecret(secret),
		AuthStyle:       domain.AuthStyle(r.AuthStyle),
		Scopes:          strings.Fields(r.Scopes),
		Skew:            millis(r.SkewMs),
		DefaultLifetime: millis(r.DefaultLifetimeMs),
		KeepAlive:       millis(r.KeepAliveMs),
		Profile:         r.Profile,
		Version:         r.Version,
		CreatedAt:       r.CreatedAt,
		UpdatedAt:       r.UpdatedAt,
		DPoP:            r.DPoP,
		Resource:        r.Resource,
		PAR:             domain.PARMode(r.Par),
		ClientKey:       key,
		TokenRate:       rate,
	}, nil
}

// millis reads a stored duration; NULL scans as 0.
func millis(v sql.NullInt64) time.Duration { return time.Duration(v.Int64) * time.Millisecond }

// nullMillis stores a duration; 0 is NULL (the global setting).
func nullMillis(d time.Duration) sql.NullInt64 {
	return sql.NullInt64{Int64: d.Milliseconds(), Valid: d > 0}
}

// Add registers p. Errors wrap domain.ErrInvalidProvider or domain.ErrProviderExists.
func (r *ProviderRepository) Add(ctx context.Context, p domain.Provider) (domain.Provider, error) {
	p.AuthStyle = cmp.Or(p.AuthStyle, domain.AuthStyleAuto)
	values, err := r.written(p)
	if err != nil {
		return domain.Provider{}, err
	}
	return r.one(ctx, r.db, "add provider", fmt.Errorf("provider %q: %w", p.Name, domain.ErrProviderExists),
		`INSERT INTO tokenguard_providers (name, `+providerWritten+`) VALUES (?, `+providerValues+`)
ON CONFLICT (name) DO NOTHING
RETURNING `+providerColumns, append([]any{p.Name}, values...)...)
}

// Update changes the provider called name (not its name) with fn, then validates and writes it,
// the version bumped, holding the row's lock, so two updates never lose each other's changes.
// Errors wrap domain.ErrUnknownProvider, domain.ErrInvalidProvider or fn's error.
func (r *ProviderRepository) Update(ctx context.Context, name string, fn func(*domain.Provider) error) (domain.Provider, error) {
	unknown := fmt.Errorf("provider %q: %w", name, domain.ErrUnknownProvider)
	var out domain.Provider
	err := r.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		cur, err := r.one(ctx, tx, "get provider", unknown, selectProvider+" WHERE name = ? FOR UPDATE", name)
		if err != nil {
			return err
		}
		next := cur
		if err := fn(&next); err != nil {
			return err
		}
		next.Name = cur.Name
		values, err := r.written(next)
		if err != nil {
			return err
		}
		out, err = r.one(ctx, tx, "update provider", unknown, `UPDATE tokenguard_providers
SET (`+providerWritten+`) = (`+providerValues+`), version = version + 1, updated_at = now()
WHERE name = ?
RETURNING `+providerColumns, append(values, name)...)
		return err
	})
	if err != nil {
		return domain.Provider{}, err
	}
	return out, nil
}

// Get reads one provider; domain.ErrUnknownProvider if there is none.
func (r *ProviderRepository) Get(ctx context.Context, name string) (domain.Provider, error) {
	return r.one(ctx, r.db, "get provider", fmt.Errorf("provider %q: %w", name, domain.ErrUnknownProvider),
		selectProvider+" WHERE name = ?", name)
}

// one runs a statement on db that returns at most one provider, opened; none is the error for none.
func (r *ProviderRepository) one(ctx context.Context, db *gorm.DB, op string, none error, sql string, args ...any) (domain.Provider, error) {
	row, err := oneRow[providerRow](ctx, db, op, none, sql, args...)
	if err != nil {
		return domain.Provider{}, err
	}
	return row.domain(r.sealer)
}

// List reads every provider, by name, secrets opened.
func (r *ProviderRepository) List(ctx context.Context) ([]domain.Provider, error) {
	return allRows(ctx, r.db, "list providers", func(row providerRow) (domain.Provider, error) { return row.domain(r.sealer) },
		selectProvider+" ORDER BY name")
}

// Connections counts the connections that name each provider.
func (r *ProviderRepository) Connections(ctx context.Context) (map[string]int, error) {
	return counted[string](ctx, r.db, "count connections by provider",
		"SELECT provider AS key, count(*) AS n FROM tokenguard_tokens WHERE provider IS NOT NULL GROUP BY provider")
}

// Remove deletes the provider name: domain.ErrProviderInUse while a connection names it.
func (r *ProviderRepository) Remove(ctx context.Context, name string) error {
	res := r.db.WithContext(ctx).Exec("DELETE FROM tokenguard_providers WHERE name = ?", name)
	switch {
	case sqlState(res.Error) == "23503":
		n, err := r.Connections(ctx)
		if err != nil {
			return fmt.Errorf("provider %q: %w", name, domain.ErrProviderInUse)
		}
		return fmt.Errorf("provider %q: %w: %d connection(s)", name, domain.ErrProviderInUse, n[name])
	case res.Error != nil:
		return storeError(ctx, "remove provider", res.Error)
	case res.RowsAffected == 0:
		return fmt.Errorf("provider %q: %w", name, domain.ErrUnknownProvider)
	}
	return nil
}

// Reseal re-encrypts every provider's client secret and key with the current key (tokenctl
// rotate-key), returning how many secrets it rewrote and how many were current already.
func (r *ProviderRepository) Reseal(ctx context.Context) (resealed, current int, err error) {
	rows, err := allRows(ctx, r.db, "list providers", asIs[providerRow], selectProvider+" ORDER BY name")
	if err != nil {
		return 0, 0, err
	}
	for _, row := range rows {
		if row.ClientKey.Valid && !r.sealer.IsCurrent(row.ClientKey.String) {
			if _, err := r.resealColumn(ctx, row.Name, "client_key", row.ClientKey.String); err != nil {
				return resealed, current, err
			}
		}
		if r.sealer.IsCurrent(row.ClientSecret) {
			current++
			continue
		}
		n, err := r.resealColumn(ctx, row.Name, "client_secret", row.ClientSecret)
		if err != nil {
			return resealed, current, err
		}
		resealed += n
	}
	return resealed, current, nil
}

// resealColumn re-encrypts provider's stored value of column if it is still the one read. The
// version stays: the value did not change, and processes need not reload for a new envelope.
func (r *ProviderRepository) resealColumn(ctx context.Context, provider, column, stored string) (int, error) {
	sealed, err := resealed(r.sealer, stored, providerAAD(provider, column))
	if err != nil {
		return 0, fmt.Errorf("%s of provider %s: %w", strings.ReplaceAll(column, "_", " "), provider, err)
	}
	res := r.db.WithContext(ctx).Exec("UPDATE tokenguard_providers SET "+column+" = ? WHERE name = ? AND "+column+" = ?",
		sealed, provider, stored)
	return int(res.RowsAffected), storeError(ctx, "reseal provider", res.Error)
}

// unknownProvider reports whether err is the tokens' provider foreign key refusing an unregistered provider.
func unknownProvider(err error) bool {
	if sqlState(err) != "23503" {
		return false
	}
	pgErr, ok := errors.AsType[*pgconn.PgError](err) // lib/pq's errors name no constraint here
	return !ok || strings.Contains(pgErr.ConstraintName, "provider")
}
