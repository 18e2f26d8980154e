ALTER TABLE tokenguard_connect_results DROP COLUMN IF EXISTS dpop_key, DROP COLUMN IF EXISTS dpop_jkt;
