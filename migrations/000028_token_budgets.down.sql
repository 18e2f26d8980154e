DROP TABLE IF EXISTS tokenguard_token_budgets;
ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS token_rate_period_ms, DROP COLUMN IF EXISTS token_rate_limit;
