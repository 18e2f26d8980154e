-- Every object tokenguard creates is named tokenguard_*, so that it never
-- meets an application's own tables (providers, api_keys, tokens...) in a
-- shared schema. Migrations 1-11 of this release create the prefixed names;
-- a database an earlier release created has the generic ones. There each
-- table is renamed, with its identity sequence, indexes, constraints and
-- triggers, to the names a new database gets, and a view under the old
-- name keeps the processes of the earlier release reading and writing the
-- same rows during the rolling deploy: a view of one table is updatable
-- (INSERT ... ON CONFLICT, UPDATE, DELETE, SELECT ... FOR UPDATE), and the
-- table's triggers, so its NOTIFYs (on unchanged channels), fire for writes
-- through it. A later release drops the views.
--
-- migrations.UpDB also runs this before migrations 2-11 on a database an
-- earlier release left below version 11, whose statements name the
-- prefixed tables; once the tables are renamed this is a no-op.
DO $$
DECLARE
    s       text := current_schema();
    at      bigint;
    tbl     text;
    rel     regclass;
    r       record;
    ours    text[];
    tries   int := 0;
    timeout text := current_setting('lock_timeout');
BEGIN
    IF to_regclass(format('%I.tokenguard_tokens', s)) IS NOT NULL THEN
        RETURN; -- created with the prefixed names, or renamed already
    END IF;
    -- The version the database is at: 12 (dirty) while golang-migrate runs
    -- this, lower when UpDB does. Only the tables tokenguard had created by
    -- then are its own; a table of the same name created later (an
    -- application's providers at version 7) is not.
    EXECUTE format('SELECT max(version) FROM %I.tokenguard_schema_migrations', s) INTO at;
    SELECT array_agg(t.name ORDER BY t.ord) INTO ours
    FROM (VALUES ('connections', 1, 1), ('tokens', 1, 2), ('client_auth_styles', 2, 3), ('api_keys', 4, 4),
                 ('connect_sessions', 4, 5), ('webhook_outbox', 4, 6), ('refresh_leases', 7, 7),
                 ('providers', 8, 8)) AS t(name, since, ord)
    JOIN pg_class c ON c.relname = t.name AND c.relnamespace = quote_ident(s)::regnamespace AND c.relkind = 'r'
    WHERE t.since <= coalesce(at, 12); -- the others are not created yet at this version
    IF ours IS NULL THEN
        RETURN;
    END IF;
    -- Every table at once, before any rename: the processes still running
    -- lock them one statement at a time, so holding one of them while
    -- waiting for another could deadlock with one of those transactions
    -- and fail the migration half-way. A short lock_timeout lets go of
    -- them all and tries again instead; the processes wait at most that
    -- long behind each try.
    PERFORM set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            EXECUTE 'LOCK TABLE ' || (SELECT string_agg(format('%I.%I', s, n), ', ') FROM unnest(ours) n)
                || ' IN ACCESS EXCLUSIVE MODE';
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            tries := tries + 1;
            IF tries >= 300 THEN
                RAISE;
            END IF;
            PERFORM pg_sleep(0.05 + random() * 0.1);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', timeout, true);
    FOREACH tbl IN ARRAY ours LOOP
        rel := format('%I.%I', s, tbl)::regclass;
        -- Indexes, with the primary key and unique constraints they back.
        FOR r IN SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                 WHERE x.indrelid = rel AND i.relname LIKE tbl || '\_%' LOOP
            EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', s, r.relname, 'tokenguard_' || r.relname);
        END LOOP;
        -- The other constraints: check, foreign key.
        FOR r IN SELECT conname FROM pg_constraint
                 WHERE conrelid = rel AND contype NOT IN ('p', 'u', 'x') AND conname LIKE tbl || '\_%' LOOP
            EXECUTE format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', rel, r.conname, 'tokenguard_' || r.conname);
        END LOOP;
        FOR r IN SELECT tgname FROM pg_trigger
                 WHERE tgrelid = rel AND NOT tgisinternal AND tgname LIKE tbl || '\_%' LOOP
            EXECUTE format('ALTER TRIGGER %I ON %s RENAME TO %I', r.tgname, rel, 'tokenguard_' || r.tgname);
        END LOOP;
        -- The identity column's sequence.
        FOR r IN SELECT q.relname FROM pg_depend d JOIN pg_class q ON q.oid = d.objid
                 WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                   AND d.refobjid = rel AND q.relkind = 'S' AND q.relname LIKE tbl || '\_%' LOOP
            EXECUTE format('ALTER SEQUENCE %I.%I RENAME TO %I', s, r.relname, 'tokenguard_' || r.relname);
        END LOOP;
        EXECUTE format('ALTER TABLE %s RENAME TO %I', rel, 'tokenguard_' || tbl);

        EXECUTE format('CREATE VIEW %I.%I AS SELECT * FROM %I.%I', s, tbl, s, 'tokenguard_' || tbl);
        EXECUTE format('COMMENT ON VIEW %I.%I IS %L', s, tbl,
            'tokenguard: the earlier release''s name of tokenguard_' || tbl || ', for its processes during a rolling deploy; a later release drops it');
        -- The roles that could use the table can use the view.
        FOR r IN SELECT a.privilege_type, a.grantee FROM pg_class c, aclexplode(c.relacl) a
                 WHERE c.oid = rel AND a.grantee <> c.relowner LOOP
            EXECUTE format('GRANT %s ON %I.%I TO %s', r.privilege_type, s, tbl,
                CASE r.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
        END LOOP;
    END LOOP;
    -- The trigger functions name the tables they write and read: the
    -- same functions, naming the new names (their bodies differ by
    -- version, so each is rewritten as it is).
    FOR r IN SELECT p.proname, p.prosrc FROM pg_proc p
             WHERE p.pronamespace = quote_ident(s)::regnamespace AND p.proname LIKE 'tokenguard\_%'
               AND p.prorettype = 'trigger'::regtype AND p.pronargs = 0 LOOP
        EXECUTE format('CREATE OR REPLACE FUNCTION %I.%I() RETURNS trigger LANGUAGE plpgsql AS %L', s, r.proname,
            regexp_replace(r.prosrc,
                '\m(connections|tokens|api_keys|providers|connect_sessions|client_auth_styles|refresh_leases|webhook_outbox)\M',
                'tokenguard_\1', 'g'));
    END LOOP;
END $$;
