ALTER TABLE refresh_leases DROP COLUMN IF EXISTS server_started;
