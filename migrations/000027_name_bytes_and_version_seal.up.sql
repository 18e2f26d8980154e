-- Connection listings page in byte order of the name (COLLATE "C"): the
-- order in which the names a pattern's literal prefix starts are one range
-- under every database collation, so that a page for a key limited to
-- tenant-a-* is one range scan of this index, whatever the table holds.
CREATE INDEX IF NOT EXISTS tokenguard_connections_name_bytes ON tokenguard_connections (name COLLATE "C");

-- Set by tokenctl rotate-key once every stored token is sealed bound to
-- its row's version (sealed_version NULL): from then on processes refuse
-- the earlier form, bound to the sealed_version column, which a copy of an
-- older version's ciphertexts can bring back along with them.
ALTER TABLE tokenguard_seal_state ADD COLUMN IF NOT EXISTS versioned boolean NOT NULL DEFAULT false;
