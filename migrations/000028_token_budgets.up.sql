-- A token-request budget per provider, shared by every process of the
-- deployment (tokenctl provider add/update --token-rate N/PERIOD; for the
-- provider of the OAUTH_* environment, OAUTH_TOKEN_RATE in each process).
-- NULL: no budget, which is what a process that predates these columns
-- applies.
ALTER TABLE tokenguard_providers
    ADD COLUMN IF NOT EXISTS token_rate_limit     integer CHECK (token_rate_limit BETWEEN 1 AND 10000),
    ADD COLUMN IF NOT EXISTS token_rate_period_ms bigint  CHECK (token_rate_period_ms >= 1);

-- One row per provider ('' is the OAUTH_* provider's), debited by the
-- transaction that claims a refresh's lease: spent holds the times of the
-- token requests of the last period, oldest first. A 429 with Retry-After
-- spends the rest of the budget until shrunk_until.
CREATE TABLE IF NOT EXISTS tokenguard_token_budgets (
    provider     text        PRIMARY KEY,
    spent        timestamptz[] NOT NULL DEFAULT '{}',
    shrunk_until timestamptz
);
