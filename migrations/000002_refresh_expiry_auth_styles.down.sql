DROP TABLE IF EXISTS client_auth_styles;
ALTER TABLE tokens DROP COLUMN IF EXISTS refresh_expiry;
