-- tokenguard_api_keys are the server's API credentials. Only the SHA-256 of a key is
-- stored: a key is 256 random bits, so its hash cannot be brute-forced and
-- needs no salt or slow hash.
CREATE TABLE tokenguard_api_keys (
    id           integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL UNIQUE
                 CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    key_hash     bytea       NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);

-- tokenguard_connect_sessions let one browser connect one connection once. The
-- session token and the flow cookie are stored as SHA-256 hashes; the OAuth2
-- state and PKCE verifier live here, not in the browser, and are cleared
-- when the callback consumes the flow.
CREATE TABLE tokenguard_connect_sessions (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash           bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    connection           text        NOT NULL
                         CHECK (connection ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    return_to            text        NOT NULL DEFAULT '',
    allow_account_change boolean     NOT NULL DEFAULT false,
    created_by           text        NOT NULL DEFAULT '',  -- the API key's name
    created_at           timestamptz NOT NULL DEFAULT now(),
    expires_at           timestamptz NOT NULL,
    opened_at            timestamptz,                      -- /oauth/connect used it
    flow_hash            bytea       UNIQUE,               -- the cookie's hash
    oauth_state          text        NOT NULL DEFAULT '',
    pkce_verifier        text        NOT NULL DEFAULT '',
    finished_at          timestamptz                       -- /oauth/callback used it
);
CREATE INDEX tokenguard_connect_sessions_expires_at ON tokenguard_connect_sessions (expires_at);

-- Who granted the connection, and what. NULL: granted by a process that
-- predates these columns, or by tokenctl import (account unknown).
ALTER TABLE tokenguard_tokens
    ADD COLUMN granted_account text,
    ADD COLUMN granted_scopes  text[],
    ADD COLUMN missing_scopes  text[],
    ADD COLUMN granted_at      timestamptz;

-- tokenguard_webhook_outbox receives, in the transaction of the token write that
-- caused it, every event a webhook announces. The worker moves the rows to
-- River (in one transaction, so each event becomes exactly one job), which
-- delivers them with retries. A crash anywhere loses none.
CREATE TABLE tokenguard_webhook_outbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    text        NOT NULL UNIQUE DEFAULT 'evt_' || replace(gen_random_uuid()::text, '-', ''),
    type        text        NOT NULL,
    connection  text        NOT NULL,
    data        jsonb       NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION tokenguard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
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
               'missing_scopes', to_jsonb(NEW.missing_scopes)))
    FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    RETURN NULL;
END $$;

CREATE TRIGGER tokenguard_tokens_webhook_outbox
    AFTER INSERT OR UPDATE OF status, granted_at ON tokenguard_tokens
    FOR EACH ROW EXECUTE FUNCTION tokenguard_webhook_outbox();
