DROP TABLE IF EXISTS tokenguard_seal_state;
ALTER TABLE tokenguard_api_keys
    DROP COLUMN IF EXISTS scopes,
    DROP COLUMN IF EXISTS connection_patterns;
ALTER TABLE tokenguard_tokens DROP COLUMN IF EXISTS sealed_version;
