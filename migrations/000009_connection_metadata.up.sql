-- The application's own bookkeeping per connection (a tenant id, an end
-- user id): a JSON object and tags, set by tokenctl import --metadata/--tags,
-- by POST /connect-sessions when the consent completes, or by the library.
-- They live on tokenguard_connections, which no token write touches: a Save or a Put
-- by a process that predates them (it names its columns) leaves them as
-- they are. Old rows read as {} and no tags.
ALTER TABLE tokenguard_connections
    ADD COLUMN IF NOT EXISTS metadata jsonb  NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS tags     text[] NOT NULL DEFAULT '{}',
    -- The version announced when the connection's token was deleted
    -- (tokenctl disconnect); 0 if it never was. A later grant of the same
    -- name continues above it (trigger below), so every process that heard
    -- of the deletion caches the new token at once instead of refusing it
    -- as older than what it heard.
    ADD COLUMN IF NOT EXISTS retired_version bigint NOT NULL DEFAULT 0;

-- The application checks the bounds (domain.NewMetadata); these are the
-- backstop. NOT VALID: existing rows hold the defaults, so the table is not
-- scanned under its lock; new writes are checked.
ALTER TABLE tokenguard_connections DROP CONSTRAINT IF EXISTS tokenguard_connections_metadata_bounds;
ALTER TABLE tokenguard_connections ADD CONSTRAINT tokenguard_connections_metadata_bounds
    CHECK (jsonb_typeof(metadata) = 'object' AND octet_length(metadata::text) <= 65536 AND cardinality(tags) <= 32) NOT VALID;

-- What a connect session gives the connection when its consent completes.
-- NULL: nothing given (the provider of the environment; metadata kept).
ALTER TABLE tokenguard_connect_sessions
    ADD COLUMN IF NOT EXISTS provider text,
    ADD COLUMN IF NOT EXISTS metadata jsonb,
    ADD COLUMN IF NOT EXISTS tags     text[];

CREATE OR REPLACE FUNCTION tokenguard_continue_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only for a name that was disconnected: otherwise the version is
    -- left to the CHECK (version >= 1).
    SELECT CASE WHEN c.retired_version > 0 AND c.retired_version >= NEW.version
                THEN c.retired_version + 1 ELSE NEW.version END INTO NEW.version
    FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS tokenguard_tokens_continue_version ON tokenguard_tokens;
CREATE TRIGGER tokenguard_tokens_continue_version
    BEFORE INSERT ON tokenguard_tokens
    FOR EACH ROW EXECUTE FUNCTION tokenguard_continue_version();

-- Webhook events carry the connection's metadata and tags, and its
-- provider when it names one.
CREATE OR REPLACE FUNCTION tokenguard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        kind := 'connection.connected';
    ELSIF OLD.status = 'active' AND NEW.status = 'needs_reauth' THEN
        kind := 'connection.needs_reauth';
    ELSIF OLD.status = 'needs_reauth' AND NEW.status = 'active' THEN
        kind := 'connection.recovered';
    ELSIF NEW.granted_at IS DISTINCT FROM OLD.granted_at THEN
        kind := 'connection.connected'; -- a new grant for a healthy connection
    ELSE
        RETURN NULL;
    END IF;
    INSERT INTO tokenguard_webhook_outbox (type, connection, data)
    SELECT kind, c.name, jsonb_strip_nulls(jsonb_build_object(
               'status', NEW.status,
               'reason', NULLIF(NEW.status_reason, ''),
               'version', NEW.version,
               'account', NEW.granted_account,
               'scopes', to_jsonb(NEW.granted_scopes),
               'missing_scopes', to_jsonb(NEW.missing_scopes),
               'provider', NEW.provider,
               'metadata', c.metadata,
               'tags', to_jsonb(c.tags)))
    FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    RETURN NULL;
END $$;
