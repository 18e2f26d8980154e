-- Stored providers get the options of the OAUTH_* provider (issue #39).
-- resource: the RFC 8707 resource indicator of every authorization and
-- token request; NULL none.
ALTER TABLE tokenguard_providers ADD COLUMN IF NOT EXISTS resource text;
-- par: when the connect flow pushes its authorization request (RFC 9126):
-- 'auto', 'always' or 'never'; NULL is auto.
ALTER TABLE tokenguard_providers ADD COLUMN IF NOT EXISTS par text
    CHECK (par IN ('auto', 'always', 'never'));
-- client_key: the PEM private key of auth_style 'private_key_jwt' (RFC
-- 7523 §2.2), sealed like client_secret (bound to the provider's name and
-- this column); NULL for the other styles.
ALTER TABLE tokenguard_providers ADD COLUMN IF NOT EXISTS client_key text;

-- auth_style admits 'private_key_jwt'. A release that predates it reads
-- the style as auto and, without the key, is refused as a client: no
-- grant is touched.
DO $$
DECLARE c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'tokenguard_providers'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%auth_style%'
    LOOP
        EXECUTE format('ALTER TABLE tokenguard_providers DROP CONSTRAINT %I', c);
    END LOOP;
END $$;
ALTER TABLE tokenguard_providers ADD CONSTRAINT tokenguard_providers_auth_style_check
    CHECK (auth_style IN ('auto', 'header', 'params', 'private_key_jwt'));
