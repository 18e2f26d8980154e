-- Every refresh in a connection's history says why it ended as it did. A
-- lease that ends without a stored token (not_stored) takes its reason
-- from, in order: the releasing transaction's tokenguard.lease_reason
-- setting (set_config(..., true): the process names the failure, a
-- timeout or the provider's answer, with no secret); else the failure
-- episode the same transaction recorded for the version (a lost answer,
-- an answer not understood, with its status and code), which processes of
-- earlier releases write too; else ''. A row a process of an earlier
-- release wrote without either keeps '' (the console says the reason was
-- not recorded).
CREATE OR REPLACE FUNCTION tokenguard_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t record;
    why text := '';
BEGIN
    SELECT c.name, tk.version, tk.status, tk.status_reason, coalesce(tk.provider, '') AS provider INTO t
    FROM tokenguard_connections c JOIN tokenguard_tokens tk ON tk.connection_id = c.id WHERE c.id = OLD.connection_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF t.version > OLD.version THEN
        IF t.status <> 'active' THEN
            why := t.status_reason;
        END IF;
    ELSE
        why := coalesce(nullif(current_setting('tokenguard.lease_reason', true), ''), (
            SELECT CASE WHEN f.code = 'answer_lost' THEN 'answer lost'
                            || CASE WHEN f.retry_at IS NULL THEN ': the refresh token is not presented again; connect again' ELSE '' END
                        ELSE 'unclassified answer: ' || CASE WHEN f.http_status <> 0 THEN 'HTTP ' || f.http_status || ' ' ELSE '' END
                            || coalesce(nullif(f.code, ''), 'no code') END
                   || ' (' || f.failures || ' in a row)'
            FROM tokenguard_refresh_failures f
            WHERE f.connection_id = OLD.connection_id AND f.version = OLD.version
              AND f.xmin::text = (txid_current() % 4294967296)::text), '');
    END IF;
    INSERT INTO tokenguard_connection_events (connection, kind, outcome, reason, provider, version, duration_ms)
    VALUES (t.name, 'refresh',
            CASE WHEN t.version <= OLD.version THEN 'not_stored' WHEN t.status = 'active' THEN 'ok' ELSE t.status END,
            why, t.provider, t.version,
            greatest(0, (extract(epoch FROM clock_timestamp() - OLD.taken_at) * 1000)::bigint));
    RETURN NULL;
END $$;
