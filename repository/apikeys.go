package repository

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// keyRow is api_keys as read (keyColumns): the arrays as JSON, NULL as null.
type keyRow struct {
	ID          int32
	Name        string
	KeyHash     string
	CreatedAt   time.Time
	LastUsedAt  *time.Time
	Scopes      string
	Connections string
}

const keyColumns = `id, name, encode(key_hash, 'hex') AS key_hash, created_at, last_used_at,
	coalesce(array_to_json(scopes)::text, 'null') AS scopes, coalesce(array_to_json(connection_patterns)::text, 'null') AS connections`

// access is what the key may do: a NULL array (nil) is everything, an empty one nothing.
func (r keyRow) access() domain.KeyAccess {
	a := domain.KeyAccess{ID: r.ID, Name: r.Name}
	_ = json.Unmarshal([]byte(r.Scopes), &a.Scopes) // array_to_json of text[], or null
	_ = json.Unmarshal([]byte(r.Connections), &a.Connections)
	return a
}

// APIKeys stores the server's API keys as SHA-256 hashes.
type APIKeys struct{ db *gorm.DB }

// NewAPIKeys binds the store to a pool.
func NewAPIKeys(db *gorm.DB) *APIKeys { return &APIKeys{db: db} }

// HashKey is how a key, a session token or a flow cookie is stored: 256 random bits need no salt.
func HashKey(s domain.Secret) []byte {
	h := sha256.Sum256([]byte(s.Reveal()))
	return h[:]
}

// hashParam is HashKey for decode(?, 'hex'): GORM would expand a []byte into a list.
func hashParam(s domain.Secret) string { return hex.EncodeToString(HashKey(s)) }

// Create stores a new key under name with what it may do (nil a.Scopes or a.Connections:
// everything) and returns the key, of which only the hash is kept; domain.ErrKeyExists if name is taken.
func (k *APIKeys) Create(ctx context.Context, name string, a domain.KeyAccess) (domain.Secret, error) {
	if err := domain.ValidateName(name); err != nil {
		return domain.Secret{}, fmt.Errorf("API key name: %w", err)
	}
	if a.Scopes != nil && len(a.Scopes) == 0 {
		return domain.Secret{}, fmt.Errorf("%w: an empty scope list", domain.ErrInvalidKeyAccess)
	}
	for _, s := range a.Scopes {
		if _, err := domain.ParseScopes([]string{string(s)}); err != nil {
			return domain.Secret{}, err
		}
	}
	if a.Connections != nil && len(a.Connections) == 0 {
		return domain.Secret{}, fmt.Errorf("%w: an empty connection pattern list", domain.ErrInvalidKeyAccess)
	}
	for _, p := range a.Connections {
		if err := domain.ValidateConnectionPattern(p); err != nil {
			return domain.Secret{}, err
		}
	}
	key := domain.NewCredential(domain.APIKeyPrefix)
	err := changedRow(ctx, k.db, "create API key", fmt.Errorf("API key %q: %w", name, domain.ErrKeyExists),
		`INSERT INTO tokenguard_api_keys (name, key_hash, scopes, connection_patterns)
VALUES (?, decode(?, 'hex'), ?::text[], ?::text[]) ON CONFLICT (name) DO NOTHING`,
		name, hashParam(key), stringArray(a.Scopes), stringArray(a.Connections))
	if err != nil {
		return domain.Secret{}, err
	}
	return key, nil
}

// List returns every key, by name.
func (k *APIKeys) List(ctx context.Context) ([]domain.APIKey, error) {
	return allRows(ctx, k.db, "list API keys", func(r keyRow) (domain.APIKey, error) {
		return domain.APIKey{KeyAccess: r.access(), CreatedAt: r.CreatedAt, LastUsedAt: r.LastUsedAt}, nil
	}, "SELECT "+keyColumns+" FROM tokenguard_api_keys ORDER BY name")
}

// Revoke deletes the key called name; domain.ErrNotFound if there is none.
func (k *APIKeys) Revoke(ctx context.Context, name string) error {
	return changedRow(ctx, k.db, "revoke API key", fmt.Errorf("API key %q: %w", name, domain.ErrNotFound),
		"DELETE FROM tokenguard_api_keys WHERE name = ?", name)
}

// KeyCache verifies API keys in constant time against the stored hashes, held for at most TTL, and
// records "last used" in batches. A revoked key stops working within TTL; a new key works at once
// (an unknown hash reloads, at most once per MinReload).
type KeyCache struct {
	keys      *APIKeys
	ttl       time.Duration
	minReload time.Duration

	mu       sync.Mutex
	loaded   time.Time
	entries  []keyEntry
	used     map[int32]struct{}
	reloadMu sync.Mutex
}

type keyEntry struct {
	access domain.KeyAccess
	hash   []byte
}

// NewKeyCache builds a cache over keys; ttl <= 0 means 2s.
func NewKeyCache(keys *APIKeys, ttl time.Duration) *KeyCache {
	if ttl <= 0 {
		ttl = 2 * time.Second
	}
	return &KeyCache{keys: keys, ttl: ttl, minReload: 200 * time.Millisecond, used: map[int32]struct{}{}}
}

// Verify returns the key and what it may do, or domain.ErrUnauthorized.
func (c *KeyCache) Verify(ctx context.Context, key domain.Secret) (domain.KeyAccess, error) {
	h := HashKey(key)
	c.mu.Lock()
	age, entries := time.Since(c.loaded), c.entries
	c.mu.Unlock()
	e, ok := match(entries, h)
	if age >= c.ttl || (!ok && age >= c.minReload) { // stale, or a key perhaps created since the last reload
		entries, err := c.reload(ctx)
		if err != nil {
			return domain.KeyAccess{}, err
		}
		e, ok = match(entries, h)
	}
	if !ok {
		return domain.KeyAccess{}, domain.ErrUnauthorized
	}
	c.mu.Lock()
	c.used[e.access.ID] = struct{}{}
	c.mu.Unlock()
	return e.access, nil
}

// match compares h with every stored hash, all of them, in constant time.
func match(entries []keyEntry, h []byte) (keyEntry, bool) {
	var found keyEntry
	ok := 0
	for _, e := range entries {
		if subtle.ConstantTimeCompare(e.hash, h) == 1 {
			found, ok = e, 1
		}
	}
	return found, ok == 1
}

// reload reads the hashes (one caller at a time) and writes "last used".
func (c *KeyCache) reload(ctx context.Context) ([]keyEntry, error) {
	c.reloadMu.Lock()
	defer c.reloadMu.Unlock()
	c.mu.Lock()
	if time.Since(c.loaded) < c.minReload {
		e := c.entries
		c.mu.Unlock()
		return e, nil
	}
	used := slices.Collect(maps.Keys(c.used))
	c.used = map[int32]struct{}{}
	c.mu.Unlock()

	db := c.keys.db.WithContext(ctx)
	if len(used) > 0 {
		// Best effort: "last used" is for operators, to a minute or so.
		_ = db.Exec("UPDATE tokenguard_api_keys SET last_used_at = now() WHERE id IN ?", used).Error
	}
	entries, err := allRows(ctx, db, "read API keys", func(r keyRow) (keyEntry, error) {
		h, _ := hex.DecodeString(r.KeyHash)
		return keyEntry{access: r.access(), hash: h}, nil
	}, "SELECT "+keyColumns+" FROM tokenguard_api_keys")
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.entries, c.loaded = entries, time.Now()
	c.mu.Unlock()
	return entries, nil
}
