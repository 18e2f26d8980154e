-- A pending grant of the connect flow bound to a DPoP key (made at the
-- code exchange) keeps the key, sealed, until it is redeemed into the
-- connection with it. NULL: a bearer grant.
ALTER TABLE tokenguard_connect_results
    ADD COLUMN IF NOT EXISTS dpop_key text,
    ADD COLUMN IF NOT EXISTS dpop_jkt text;
