-- The views of an upgraded database go; the tables keep the names
-- migrations 1-11 of this release give them, which their down migrations
-- name. (Processes of the earlier release need the views: do not run this
-- while any is left.)
DO $$
DECLARE
    tbl text;
BEGIN
    FOREACH tbl IN ARRAY ARRAY['connections', 'tokens', 'api_keys', 'providers', 'connect_sessions',
                               'client_auth_styles', 'refresh_leases', 'webhook_outbox'] LOOP
        -- Only the views 000012 made (an application may have its own).
        IF EXISTS (SELECT FROM pg_class WHERE relname = tbl AND relnamespace = quote_ident(current_schema())::regnamespace
                   AND relkind = 'v' AND obj_description(oid, 'pg_class') LIKE 'tokenguard:%') THEN
            EXECUTE format('DROP VIEW %I.%I', current_schema(), tbl);
        END IF;
    END LOOP;
END $$;
