DROP TABLE IF EXISTS refresh_leases;
