-- Scopes as granted: the scope each refresh answer names is kept with the
-- token (answered_scopes; NULL: no answer named one since the grant, so
-- the scope is unchanged, RFC 6749 §5.1), and the scopes granted at
-- connect time that it lacks (scopes_reduced; NULL or empty: none, or
-- the granted scopes are unknown, as on rows written before this
-- migration). Processes of an earlier release never write these columns:
-- what they leave there stays until the next refresh that names a scope.
ALTER TABLE tokenguard_tokens
    ADD COLUMN IF NOT EXISTS answered_scopes text[],
    ADD COLUMN IF NOT EXISTS scopes_reduced  text[];

-- One connection.scopes_reduced event per reduction, written in the
-- transaction that stores the token: only when the write adds a scope to
-- those already known missing, never again for the same reduction at
-- the next refresh.
CREATE OR REPLACE FUNCTION tokenguard_scopes_reduced_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tokenguard_webhook_outbox (type, connection, data)
    SELECT 'connection.scopes_reduced', c.name, jsonb_strip_nulls(jsonb_build_object(
               'status', NEW.status,
               'version', NEW.version,
               'account', NEW.granted_account,
               'granted_scopes', to_jsonb(NEW.granted_scopes),
               'scopes', to_jsonb(NEW.answered_scopes),
               'scopes_reduced', to_jsonb(NEW.scopes_reduced),
               'provider', NEW.provider,
               'metadata', c.metadata,
               'tags', to_jsonb(c.tags)))
    FROM tokenguard_connections c WHERE c.id = NEW.connection_id;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tokenguard_tokens_scopes_reduced ON tokenguard_tokens;
CREATE TRIGGER tokenguard_tokens_scopes_reduced
    AFTER UPDATE OF scopes_reduced ON tokenguard_tokens
    FOR EACH ROW
    WHEN (cardinality(NEW.scopes_reduced) > 0
          AND NOT (NEW.scopes_reduced <@ coalesce(OLD.scopes_reduced, '{}'::text[])))
    EXECUTE FUNCTION tokenguard_scopes_reduced_outbox();
