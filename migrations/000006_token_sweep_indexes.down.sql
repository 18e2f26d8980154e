DROP INDEX IF EXISTS tokenguard_tokens_active_expiry;
DROP INDEX IF EXISTS tokenguard_tokens_active_obtained;
