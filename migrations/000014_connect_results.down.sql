DROP TABLE IF EXISTS tokenguard_connect_results;
