-- The proactive sweep (repository/ahead.go ExpiringBefore) pages through the
-- active tokens soonest expiry first; this index serves each page with a
-- range scan, so a page costs the same at a thousand rows as at millions.
-- Not CONCURRENTLY: that would wait for the other processes queued on
-- golang-migrate's lock, which wait for this one. On a large table, build it
-- by hand first with CREATE INDEX CONCURRENTLY (same name); this is then a
-- no-op.
CREATE INDEX IF NOT EXISTS tokenguard_tokens_active_expiry ON tokenguard_tokens (expiry, connection_id)
    WHERE status = 'active';

-- The same for the keep-alive sweep (batch --keep-alive), oldest refresh first.
CREATE INDEX IF NOT EXISTS tokenguard_tokens_active_obtained ON tokenguard_tokens (obtained_at, connection_id)
    WHERE status = 'active';
