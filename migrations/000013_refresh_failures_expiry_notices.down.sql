DROP TRIGGER IF EXISTS tokenguard_tokens_written ON tokenguard_tokens;
DROP FUNCTION IF EXISTS tokenguard_token_written();
DROP TABLE IF EXISTS tokenguard_expiry_notices;
DROP TABLE IF EXISTS tokenguard_refresh_failures;
DROP FUNCTION IF EXISTS tokenguard_refresh_failing();
