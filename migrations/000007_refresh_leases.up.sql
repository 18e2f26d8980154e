-- A refresh lease says that a process is presenting a connection's refresh
-- token (of token version `version`) at the provider, or writing what the
-- provider answered. The process commits it on a connection of its own,
-- after taking the connection's advisory lock and before calling the
-- provider, so that it outlives that lock: if the lock's session ends while
-- the call is in flight (a terminated backend, a Postgres restart), the
-- next lock holder finds the lease and waits for it instead of presenting
-- the same refresh token, which a strict provider takes for a reuse and
-- answers by revoking the grant (repository/lease.go).
--
-- A lease is over when a newer version is stored (it names the version it
-- was taken for), when its holder releases it, or at `until`.
CREATE TABLE IF NOT EXISTS tokenguard_refresh_leases (
    connection_id integer     PRIMARY KEY REFERENCES tokenguard_connections (id) ON DELETE CASCADE,
    version       bigint      NOT NULL,
    holder        uuid        NOT NULL,
    until         timestamptz NOT NULL
);
