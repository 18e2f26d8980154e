-- tokenguard_providers are the OAuth2 client registrations connections may name
-- (tokenctl provider add). A connection without one (tokenguard_tokens.provider NULL:
-- every row written before this table, and by processes that do not know
-- it) uses the provider of the OAUTH_* environment.
CREATE TABLE IF NOT EXISTS tokenguard_providers (
    id               integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text        NOT NULL UNIQUE
                     CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    token_url        text        NOT NULL CHECK (token_url <> ''),
    auth_url         text        NOT NULL DEFAULT '',
    revocation_url   text        NOT NULL DEFAULT '',
    api_base_url     text        NOT NULL DEFAULT '',
    client_id        text        NOT NULL CHECK (client_id <> ''),
    -- Sealed with TOKEN_ENCRYPTION_KEYS like the tokens (bound to the
    -- provider's name); plaintext only where the tokens are too.
    client_secret    text        NOT NULL DEFAULT '',
    auth_style       text        NOT NULL DEFAULT 'auto'
                     CHECK (auth_style IN ('auto', 'header', 'params')),
    scopes           text[],
    -- NULL: the process's global setting (TOKEN_REFRESH_SKEW,
    -- TOKEN_DEFAULT_LIFETIME, batch --keep-alive).
    skew_ms             bigint   CHECK (skew_ms >= 0),
    default_lifetime_ms bigint   CHECK (default_lifetime_ms >= 0),
    keep_alive_ms       bigint   CHECK (keep_alive_ms >= 0),
    version          bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The provider a connection's grant was issued by. NULL: the environment's.
-- A provider cannot be removed while a connection names it.
ALTER TABLE tokenguard_tokens ADD COLUMN IF NOT EXISTS provider text
    REFERENCES tokenguard_providers (name) ON UPDATE CASCADE ON DELETE RESTRICT;
CREATE INDEX IF NOT EXISTS tokenguard_tokens_provider ON tokenguard_tokens (provider) WHERE provider IS NOT NULL;

-- Every change of a provider is announced (at commit) on
-- tokenguard_provider_changed, suffixed per schema as the token channel is
-- (repository.ChannelFor), with the provider's name: every process reloads
-- its providers, a rotated client secret included, without a restart.
CREATE OR REPLACE FUNCTION tokenguard_provider_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        name := OLD.name;
    ELSE
        name := NEW.name;
    END IF;
    PERFORM pg_notify(CASE current_schema() WHEN 'public' THEN 'tokenguard_provider_changed'
                      ELSE 'tokenguard_provider_changed_' || left(md5(current_schema()), 16) END, name);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_providers_changed ON tokenguard_providers;
CREATE TRIGGER tokenguard_providers_changed
    AFTER INSERT OR UPDATE OR DELETE ON tokenguard_providers
    FOR EACH ROW EXECUTE FUNCTION tokenguard_provider_changed();
