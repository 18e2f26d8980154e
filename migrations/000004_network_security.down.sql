DROP TRIGGER IF EXISTS tokenguard_tokens_webhook_outbox ON tokenguard_tokens;
DROP FUNCTION IF EXISTS tokenguard_webhook_outbox();
DROP TABLE IF EXISTS tokenguard_webhook_outbox;
ALTER TABLE tokenguard_tokens
    DROP COLUMN IF EXISTS granted_account,
    DROP COLUMN IF EXISTS granted_scopes,
    DROP COLUMN IF EXISTS missing_scopes,
    DROP COLUMN IF EXISTS granted_at;
DROP TABLE IF EXISTS tokenguard_connect_sessions;
DROP TABLE IF EXISTS tokenguard_api_keys;
