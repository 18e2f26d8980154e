ALTER TABLE tokenguard_refresh_leases DROP COLUMN IF EXISTS server_started;
