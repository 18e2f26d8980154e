-- The WAL timelines on which processes have claimed refreshes, each with
-- when the first claim found it. A promoted standby (or a restored backup)
-- starts a new timeline, and may lack leases the old primary committed but
-- never sent: an asynchronous standby loses the last commits. A refresh
-- token under such a lease may be at the provider, so on a timeline that
-- follows another, no lease is granted for a grace period from its first
-- claim, while holders reconnect and restore their leases
-- (repository/lease.go). A process that predates this table grants leases
-- as before.
CREATE TABLE IF NOT EXISTS tokenguard_timelines (
    timeline integer     PRIMARY KEY,
    since    timestamptz NOT NULL DEFAULT now()
);
