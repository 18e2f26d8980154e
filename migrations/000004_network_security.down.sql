DROP TRIGGER IF EXISTS tokens_webhook_outbox ON tokens;
DROP FUNCTION IF EXISTS tokenguard_webhook_outbox();
DROP TABLE IF EXISTS webhook_outbox;
ALTER TABLE tokens
    DROP COLUMN IF EXISTS granted_account,
    DROP COLUMN IF EXISTS granted_scopes,
    DROP COLUMN IF EXISTS missing_scopes,
    DROP COLUMN IF EXISTS granted_at;
DROP TABLE IF EXISTS connect_sessions;
DROP TABLE IF EXISTS api_keys;
