-- DPoP (RFC 9449): a sender-constrained grant is worthless without the
-- private key it is bound to, so the key is stored with the grant.
-- dpop_jkt is the RFC 7638 thumbprint of the key the connection's grant is
-- bound to; NULL: a bearer grant (every row before this migration).
ALTER TABLE tokenguard_tokens ADD COLUMN IF NOT EXISTS dpop_jkt text;

-- The private keys, sealed like the tokens (the additional data names the
-- connection's id and the key's thumbprint, so a key copied to another
-- connection, or under another thumbprint, does not open). Written in the
-- transaction that stores the grant; a new grant replaces them.
CREATE TABLE IF NOT EXISTS tokenguard_dpop_keys (
    connection_id integer     NOT NULL REFERENCES tokenguard_connections (id) ON DELETE CASCADE,
    jkt           text        NOT NULL CHECK (jkt <> ''),
    private_key   text        NOT NULL CHECK (private_key <> ''),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, jkt)
);

-- A stored provider that requires DPoP: its connections get a key of
-- their own at connect time. NULL: no.
ALTER TABLE tokenguard_providers ADD COLUMN IF NOT EXISTS dpop boolean;
