DROP TABLE IF EXISTS tokenguard_refresh_leases;
