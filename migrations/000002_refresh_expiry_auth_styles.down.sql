DROP TABLE IF EXISTS tokenguard_client_auth_styles;
ALTER TABLE tokenguard_tokens DROP COLUMN IF EXISTS refresh_expiry;
