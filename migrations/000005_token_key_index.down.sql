DROP INDEX IF EXISTS tokens_key_id;
