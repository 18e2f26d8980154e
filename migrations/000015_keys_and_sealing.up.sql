-- What an API key may do. NULL: everything, as every key created before
-- these columns could (an upgrade takes no right away). scopes are names
-- of domain.AllScopes; connection_patterns are globs over connection
-- names.
ALTER TABLE tokenguard_api_keys
    ADD COLUMN IF NOT EXISTS scopes              text[],
    ADD COLUMN IF NOT EXISTS connection_patterns text[];

-- The version a row's sealed credentials are bound to (the additional
-- data of their AEAD names it with the connection's id): an older
-- ciphertext copied back into the row, or into another connection's, no
-- longer opens. NULL: sealed by a release that bound them to the
-- connection's name and the column only, or stored as plaintext.
ALTER TABLE tokenguard_tokens ADD COLUMN IF NOT EXISTS sealed_version bigint;

-- One row once tokenctl rotate-key has resealed every stored token in the
-- bound form: from then on processes refuse a value in any other form at
-- start-up and at run time (it was written around tokenguard, or copied
-- back from before the upgrade).
CREATE TABLE IF NOT EXISTS tokenguard_seal_state (
    only_bound       boolean     PRIMARY KEY DEFAULT true CHECK (only_bound),
    since            timestamptz NOT NULL DEFAULT now()
);
