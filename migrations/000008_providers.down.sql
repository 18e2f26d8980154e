DROP INDEX IF EXISTS tokens_provider;
ALTER TABLE tokens DROP COLUMN IF EXISTS provider;
DROP TRIGGER IF EXISTS providers_changed ON providers;
DROP FUNCTION IF EXISTS tokenguard_provider_changed();
DROP TABLE IF EXISTS providers;
