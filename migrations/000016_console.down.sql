DROP TRIGGER IF EXISTS tokenguard_webhook_outbox_event ON tokenguard_webhook_outbox;
DROP FUNCTION IF EXISTS tokenguard_outbox_event();
DROP TRIGGER IF EXISTS tokenguard_refresh_leases_event ON tokenguard_refresh_leases;
DROP FUNCTION IF EXISTS tokenguard_lease_event();
ALTER TABLE tokenguard_refresh_leases DROP COLUMN IF EXISTS taken_at;
DROP TABLE IF EXISTS tokenguard_connection_events;
DROP TABLE IF EXISTS tokenguard_console_sessions;
