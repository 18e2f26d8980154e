ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS dpop;
DROP TABLE IF EXISTS tokenguard_dpop_keys;
ALTER TABLE tokenguard_tokens DROP COLUMN IF EXISTS dpop_jkt;
