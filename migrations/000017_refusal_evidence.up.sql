-- What a token endpoint's refusals mean is learned, per token URL and
-- client credentials, from evidence every process shares
-- (docs/design.md, "Refusals classified by evidence"):
--   check_*: the answer the start-up check got for a refresh token that
--     cannot exist (its status, its code as reported, and whether the
--     client was authenticated, i.e. not refused);
--   worked_*: when a refresh or code exchange last succeeded with these
--     credentials, and in which auth style.
-- credentials is a digest of the client id and secret, never the secret:
-- a changed secret starts with no evidence. Processes of an earlier
-- release never read this table.
CREATE TABLE IF NOT EXISTS tokenguard_refusal_evidence (
    token_url            text        NOT NULL,
    client_id            text        NOT NULL,
    credentials          text        NOT NULL,
    check_status         integer,
    check_code           text,
    check_client_authenticated boolean,
    checked_at           timestamptz,
    worked_style         text,
    worked_at            timestamptz,
    PRIMARY KEY (token_url, client_id, credentials)
);
