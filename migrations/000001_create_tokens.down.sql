DROP TABLE IF EXISTS tokenguard_tokens;
DROP TABLE IF EXISTS tokenguard_connections;
