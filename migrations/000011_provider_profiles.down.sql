ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS profile;
