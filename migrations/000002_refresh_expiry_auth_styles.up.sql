-- When the refresh token itself expires, if the provider said
-- (refresh_token_expires_in). NULL: unknown. Rows written before this
-- column, and by processes that do not know it, read as unknown.
ALTER TABLE tokenguard_tokens ADD COLUMN IF NOT EXISTS refresh_expiry timestamptz;

-- The client authentication style a token endpoint accepted, learned by
-- OAUTH_AUTH_STYLE=auto, so that other processes and restarts start with
-- it instead of probing.
CREATE TABLE IF NOT EXISTS tokenguard_client_auth_styles (
    token_url  text        NOT NULL,
    client_id  text        NOT NULL,
    style      text        NOT NULL CHECK (style IN ('header', 'params')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (token_url, client_id)
);
