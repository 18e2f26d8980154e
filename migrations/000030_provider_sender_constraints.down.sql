UPDATE tokenguard_providers SET auth_style = 'auto' WHERE auth_style = 'private_key_jwt';
ALTER TABLE tokenguard_providers DROP CONSTRAINT IF EXISTS tokenguard_providers_auth_style_check;
ALTER TABLE tokenguard_providers ADD CONSTRAINT tokenguard_providers_auth_style_check
    CHECK (auth_style IN ('auto', 'header', 'params'));
ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS client_key;
ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS par;
ALTER TABLE tokenguard_providers DROP COLUMN IF EXISTS resource;
