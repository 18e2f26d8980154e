DROP INDEX IF EXISTS tokenguard_tokens_provider;
ALTER TABLE tokenguard_tokens DROP COLUMN IF EXISTS provider;
DROP TRIGGER IF EXISTS tokenguard_providers_changed ON tokenguard_providers;
DROP FUNCTION IF EXISTS tokenguard_provider_changed();
DROP TABLE IF EXISTS tokenguard_providers;
