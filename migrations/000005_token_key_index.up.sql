-- The key id of each stored refresh token ('' for plaintext), so that the
-- start-up key check reads the key ids in use with a skip scan instead of
-- every row (repository/reseal.go). Not CONCURRENTLY: that would wait for
-- the other processes queued on golang-migrate's lock, which wait for this
-- one. On a large table, build it by hand first with
-- CREATE INDEX CONCURRENTLY (same name); this is then a no-op.
CREATE INDEX IF NOT EXISTS tokenguard_tokens_key_id ON tokenguard_tokens
    ((CASE WHEN refresh_token LIKE 'tg1:%' THEN split_part(refresh_token, ':', 2) ELSE '' END));
