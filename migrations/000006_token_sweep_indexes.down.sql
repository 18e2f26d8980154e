DROP INDEX IF EXISTS tokens_active_expiry;
DROP INDEX IF EXISTS tokens_active_obtained;
