DROP TRIGGER IF EXISTS tokenguard_tokens_scopes_reduced ON tokenguard_tokens;
DROP FUNCTION IF EXISTS tokenguard_scopes_reduced_outbox();
ALTER TABLE tokenguard_tokens
    DROP COLUMN IF EXISTS answered_scopes,
    DROP COLUMN IF EXISTS scopes_reduced;
