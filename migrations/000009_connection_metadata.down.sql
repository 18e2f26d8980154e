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
               'missing_scopes', to_jsonb(NEW.missing_scopes)))
    FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS tokenguard_tokens_continue_version ON tokenguard_tokens;
DROP FUNCTION IF EXISTS tokenguard_continue_version();
ALTER TABLE tokenguard_connect_sessions
    DROP COLUMN IF EXISTS provider,
    DROP COLUMN IF EXISTS metadata,
    DROP COLUMN IF EXISTS tags;
ALTER TABLE tokenguard_connections DROP CONSTRAINT IF EXISTS tokenguard_connections_metadata_bounds;
ALTER TABLE tokenguard_connections
    DROP COLUMN IF EXISTS metadata,
    DROP COLUMN IF EXISTS tags,
    DROP COLUMN IF EXISTS retired_version;
