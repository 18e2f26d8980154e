-- A connection whose refreshes fail in a way tokenguard cannot classify (an
-- unknown code, a body that is not JSON, a 4xx without a code), or whose
-- last refresh's answer was lost at a provider that forbids presenting the
-- refresh token again: one row while it lasts. Every process reads it with
-- the token (under the connection's lock before a refresh), so the backoff
-- holds fleet-wide: no attempt before retry_at; retry_at NULL: none until a
-- new grant; replay_until: the end of the provider's reuse grace window for
-- a refresh token whose answer was lost. failing: the connection is shown
-- as failing (after a few failures in a row, or at once for a lost answer
-- that cannot be replayed). The row counts only for the token version it
-- names; any new version (a refresh, a new grant, needs_reauth) deletes it.
-- A process that predates this table neither reads nor writes it.
CREATE TABLE IF NOT EXISTS tokenguard_refresh_failures (
    connection_id integer     PRIMARY KEY REFERENCES tokenguard_connections (id) ON DELETE CASCADE,
    version       bigint      NOT NULL,
    failures      integer     NOT NULL CHECK (failures >= 1),
    since         timestamptz NOT NULL,
    last_at       timestamptz NOT NULL,
    retry_at      timestamptz,
    replay_until  timestamptz,
    http_status   integer     NOT NULL DEFAULT 0,
    code          text        NOT NULL DEFAULT '',
    failing       boolean     NOT NULL DEFAULT false
);

-- connection.refresh_failing, once per episode: when a row becomes failing.
CREATE OR REPLACE FUNCTION tokenguard_refresh_failing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT NEW.failing OR (TG_OP = 'UPDATE' AND OLD.failing) THEN
        RETURN NULL;
    END IF;
    INSERT INTO tokenguard_webhook_outbox (type, connection, data)
    SELECT 'connection.refresh_failing', c.name, jsonb_strip_nulls(jsonb_build_object(
               'status', 'failing',
               'http_status', NULLIF(NEW.http_status, 0),
               'code', NULLIF(NEW.code, ''),
               'failures', NEW.failures,
               'since', NEW.since,
               'next_attempt', NEW.retry_at,
               'version', NEW.version,
               'provider', t.provider,
               'metadata', c.metadata,
               'tags', to_jsonb(c.tags)))
    FROM tokenguard_connections c LEFT JOIN tokenguard_tokens t ON t.connection_id = c.id WHERE c.id = NEW.connection_id;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_refresh_failures_webhook ON tokenguard_refresh_failures;
CREATE TRIGGER tokenguard_refresh_failures_webhook
    AFTER INSERT OR UPDATE OF failing ON tokenguard_refresh_failures
    FOR EACH ROW EXECUTE FUNCTION tokenguard_refresh_failing();

-- Expiry notices: the connections whose refresh token's absolute expiry
-- (tokens.refresh_expiry) was announced by a connection.expiring webhook,
-- once per grant (a new grant deletes the row, trigger below).
CREATE TABLE IF NOT EXISTS tokenguard_expiry_notices (
    connection_id  integer     PRIMARY KEY REFERENCES tokenguard_connections (id) ON DELETE CASCADE,
    refresh_expiry timestamptz NOT NULL,
    sent_at        timestamptz NOT NULL DEFAULT now()
);

-- A new token version ends a failure episode (connection.recovered when
-- the connection was shown failing and is active); a new grant makes its
-- own expiry announceable again. Written as a trigger so that processes
-- that predate this migration end episodes too.
CREATE OR REPLACE FUNCTION tokenguard_token_written() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    f tokenguard_refresh_failures;
BEGIN
    IF TG_OP = 'INSERT' OR NEW.granted_at IS DISTINCT FROM OLD.granted_at THEN
        DELETE FROM tokenguard_expiry_notices WHERE connection_id = NEW.connection_id;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.version = OLD.version THEN
        RETURN NULL;
    END IF;
    DELETE FROM tokenguard_refresh_failures WHERE connection_id = NEW.connection_id RETURNING * INTO f;
    IF f.failing AND NEW.status = 'active' THEN
        INSERT INTO tokenguard_webhook_outbox (type, connection, data)
        SELECT 'connection.recovered', c.name, jsonb_strip_nulls(jsonb_build_object(
                   'status', NEW.status,
                   'version', NEW.version,
                   'failures', f.failures,
                   'failing_since', f.since,
                   'account', NEW.granted_account,
                   'provider', NEW.provider,
                   'metadata', c.metadata,
                   'tags', to_jsonb(c.tags)))
        FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_tokens_written ON tokenguard_tokens;
CREATE TRIGGER tokenguard_tokens_written
    AFTER INSERT OR UPDATE OF version, granted_at ON tokenguard_tokens
    FOR EACH ROW EXECUTE FUNCTION tokenguard_token_written();
