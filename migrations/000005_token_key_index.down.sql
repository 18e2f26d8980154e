DROP INDEX IF EXISTS tokenguard_tokens_key_id;
