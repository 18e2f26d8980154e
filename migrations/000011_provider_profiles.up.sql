-- The provider profile a stored provider was added with (tokenctl provider
-- add --profile): every process applies the profile's own dead-grant codes
-- and keeps its extra answer fields, by name, from the catalog compiled
-- into it. '' is the generic profile, which is what a process that
-- predates this column does with every provider.
ALTER TABLE tokenguard_providers ADD COLUMN IF NOT EXISTS profile text NOT NULL DEFAULT ''
    CHECK (profile ~ '^([a-z0-9][a-z0-9_-]{0,63})?$');
