ALTER TABLE tokenguard_seal_state DROP COLUMN IF EXISTS versioned;
DROP INDEX IF EXISTS tokenguard_connections_name_bytes;
