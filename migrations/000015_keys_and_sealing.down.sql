DROP TABLE IF EXISTS tokenguard_seal_state;
ALTER TABLE api_keys
    DROP COLUMN IF EXISTS scopes,
    DROP COLUMN IF EXISTS connection_patterns;
ALTER TABLE tokens DROP COLUMN IF EXISTS sealed_version;
