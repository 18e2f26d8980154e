-- tokenguard_connections is the registry of connection names. Its integer id is the
-- advisory-lock key of the connection (see repository/lockkey.go), so a lock
-- can be taken before the connection has a token and two names never share one.
CREATE TABLE tokenguard_connections (
    id         integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE
               CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- tokenguard_tokens holds the one current token of a connection.
CREATE TABLE tokenguard_tokens (
    connection_id integer     PRIMARY KEY REFERENCES tokenguard_connections (id) ON DELETE CASCADE,
    access_token  text        NOT NULL CHECK (access_token <> ''),
    token_type    text        NOT NULL DEFAULT 'Bearer',
    -- A refresh token can only be replaced by a newer one, never emptied.
    refresh_token text        NOT NULL CHECK (refresh_token <> ''),
    expiry        timestamptz,           -- NULL: the provider gave no expiry
    obtained_at   timestamptz NOT NULL,
    version       bigint      NOT NULL CHECK (version >= 1),
    status        text        NOT NULL DEFAULT 'active'
                  CHECK (status IN ('active', 'needs_reauth')),
    status_reason text        NOT NULL DEFAULT '',
    updated_at    timestamptz NOT NULL DEFAULT now()
);
