-- The lease trigger of 000016: not_stored rows without a reason.
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
