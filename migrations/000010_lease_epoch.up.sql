-- A refresh lease is now taken in the lock's own transaction and committed
-- with it (the lock is then let go while the provider call runs), and
-- renewed by its holder's process. server_started is the start of the
-- Postgres server on which the lease was last taken or renewed: a lease
-- that a restart or a failover (a promoted standby started at another
-- time) interrupted is not judged by its `until`, which its holder could
-- not extend while the server was away, but held for a grace period from
-- the moment a process first finds it on the new server. NULL (leases of
-- earlier releases) counts as another server's.
ALTER TABLE tokenguard_refresh_leases ADD COLUMN IF NOT EXISTS server_started timestamptz;
