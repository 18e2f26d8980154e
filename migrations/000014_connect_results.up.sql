-- tokenguard_connect_results keep a grant the connect flow obtained but did
-- not store: the application's backend redeems the one-time result code
-- (POST /connect-results, stored as its SHA-256 like API keys) after
-- checking that the browser which brought it belongs to the user who asked
-- for the session, and only then is the grant stored. A result never
-- redeemed expires: its grant is revoked at the provider and the row
-- deleted. The tokens are sealed as in tokens, bound to the result's hash.
CREATE TABLE IF NOT EXISTS tokenguard_connect_results (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    result_hash          bytea       NOT NULL UNIQUE CHECK (length(result_hash) = 32),
    connection           text        NOT NULL
                         CHECK (connection ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    provider             text,                              -- NULL: the environment's
    created_by           text        NOT NULL DEFAULT '',   -- the API key's name
    allow_account_change boolean     NOT NULL DEFAULT false,
    metadata             jsonb,                             -- NULL: keep the connection's
    tags                 text[],
    provider_fields      jsonb,
    granted_account      text        NOT NULL DEFAULT '',
    granted_scopes       text[]      NOT NULL DEFAULT '{}',
    missing_scopes       text[]      NOT NULL DEFAULT '{}',
    access_token         text        NOT NULL,
    token_type           text        NOT NULL DEFAULT '',
    refresh_token        text        NOT NULL,
    expiry               timestamptz,
    refresh_expiry       timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    expires_at           timestamptz NOT NULL,
    -- The sweep that revokes an expired result's grant holds no connection
    -- during the revocation: it leases the row until then instead.
    sweep_after          timestamptz
);
CREATE INDEX IF NOT EXISTS tokenguard_connect_results_expires_at ON tokenguard_connect_results (expires_at);
