-- The operator console (GET /console). Its sessions: an API key entered
-- once on the login form buys a session token kept in an HttpOnly cookie;
-- only the token's SHA-256 is stored, so a copy of this table logs nobody
-- in. Revoking the key (tokenctl apikey revoke) ends its sessions with it;
-- logging out deletes the row.
CREATE TABLE IF NOT EXISTS tokenguard_console_sessions (
    token_hash bytea       PRIMARY KEY CHECK (length(token_hash) = 32),
    api_key_id integer     NOT NULL REFERENCES tokenguard_api_keys (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS tokenguard_console_sessions_expires_at ON tokenguard_console_sessions (expires_at);

-- A connection's recent history, for the console: refreshes with their
-- outcome and duration, and the changes webhooks announce (connected,
-- needs_reauth, recovered, disconnected, rolled_back). Rows are written by
-- triggers inside statements that already run (no round trip and no
-- connection is added to a refresh), so processes of earlier releases
-- record history too. The server prunes it to the last 100 rows per
-- connection and 30 days (repository.PruneEvents).
CREATE TABLE IF NOT EXISTS tokenguard_connection_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    connection  text        NOT NULL,
    kind        text        NOT NULL,  -- refresh, connected, needs_reauth, recovered, disconnected, ...
    outcome     text        NOT NULL DEFAULT '',  -- of a refresh: ok, needs_reauth, not_stored
    reason      text        NOT NULL DEFAULT '',
    provider    text        NOT NULL DEFAULT '',  -- '' is the OAUTH_* one
    version     bigint,
    duration_ms bigint,     -- of a refresh: from its lease to its end
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS tokenguard_connection_events_connection ON tokenguard_connection_events (connection, id);
-- Rows arrive in time order: a BRIN index serves the last hour's rates and
-- the 30-day pruning at almost no cost to each insert.
CREATE INDEX IF NOT EXISTS tokenguard_connection_events_occurred_at ON tokenguard_connection_events USING brin (occurred_at);

-- When a lease was taken: a refresh's duration runs from there. Leases of
-- earlier releases taken over an expired one keep the older time.
ALTER TABLE tokenguard_refresh_leases ADD COLUMN IF NOT EXISTS taken_at timestamptz NOT NULL DEFAULT now();

-- A lease ends when the refresh it was taken for ends: deleted by the
-- statement that stores the next version (a rotated token, or the grant
-- marked needs_reauth), or released without a write (the provider call
-- failed and the stored token was kept). That deletion records the
-- refresh; the token's row, as the deleting statement left it, says how it
-- ended. No token left: a disconnection, recorded as such below.
CREATE OR REPLACE FUNCTION tokenguard_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    SELECT c.name, tk.version, tk.status, tk.status_reason, coalesce(tk.provider, '') AS provider INTO t
    FROM tokenguard_connections c JOIN tokenguard_tokens tk ON tk.connection_id = c.id WHERE c.id = OLD.connection_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO tokenguard_connection_events (connection, kind, outcome, reason, provider, version, duration_ms)
    VALUES (t.name, 'refresh',
            CASE WHEN t.version <= OLD.version THEN 'not_stored' WHEN t.status = 'active' THEN 'ok' ELSE t.status END,
            CASE WHEN t.version > OLD.version AND t.status <> 'active' THEN t.status_reason ELSE '' END,
            t.provider, t.version,
            greatest(0, (extract(epoch FROM clock_timestamp() - OLD.taken_at) * 1000)::bigint));
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_refresh_leases_event ON tokenguard_refresh_leases;
CREATE TRIGGER tokenguard_refresh_leases_event
    AFTER DELETE ON tokenguard_refresh_leases
    FOR EACH ROW EXECUTE FUNCTION tokenguard_lease_event();

-- Every event a webhook announces is history too, written with it.
CREATE OR REPLACE FUNCTION tokenguard_outbox_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tokenguard_connection_events (connection, kind, reason, provider, version, occurred_at)
    VALUES (NEW.connection, CASE WHEN NEW.type LIKE 'connection.%' THEN substr(NEW.type, 12) ELSE NEW.type END,
            coalesce(NEW.data ->> 'reason', ''), coalesce(NEW.data ->> 'provider', ''),
            (NEW.data ->> 'version')::bigint, NEW.occurred_at);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_webhook_outbox_event ON tokenguard_webhook_outbox;
CREATE TRIGGER tokenguard_webhook_outbox_event
    AFTER INSERT ON tokenguard_webhook_outbox
    FOR EACH ROW EXECUTE FUNCTION tokenguard_outbox_event();
