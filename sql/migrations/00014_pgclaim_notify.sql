-- Claimable rows announced by a trigger on the user's table.
-- Released migrations are never edited; add a new file.

-- +goose Up
-- pgclaim_notify_on(table, column, value) attaches two statement-level
-- triggers to a user's table: after an INSERT, and after an UPDATE, each
-- statement that left more rows with column = value than it found sends one
-- NOTIFY on channel 'pgclaim_claim_' || the table's oid, its payload the
-- value. Claim workers listening on that channel claim at once instead of at
-- their next poll. Delivered at commit: a rolled-back statement announces
-- nothing; identical notifications of one transaction are folded into one.
-- The table's owner (or a role with TRIGGER on it) calls it, for example in
-- the application's own goose migration:
--
--   SELECT pgclaim_notify_on('items'::regclass, 'status', 'PAUSED');
--
-- The trigger function reads the statement's rows from its transition
-- tables (pgclaim_new, pgclaim_old), so it runs once per statement whatever
-- the number of rows, and compares the column as text with the value as
-- the column's type prints it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_notify_claimable() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    col     text := TG_ARGV[0];
    val     text := TG_ARGV[1];
    entered boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgclaim_new WHERE %I::text = $1)', col)
            INTO entered USING val;
    ELSE
        -- Most updates (claims, finishes) leave no row in the state: one
        -- scan of the new rows decides. Otherwise the statement announces
        -- when it left more rows in the state than it found.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgclaim_new WHERE %I::text = $1)', col)
            INTO entered USING val;
        IF entered THEN
            EXECUTE format('SELECT (SELECT count(*) FROM pgclaim_new WHERE %1$I::text = $1)'
                        || ' > (SELECT count(*) FROM pgclaim_old WHERE %1$I::text = $1)', col)
                INTO entered USING val;
        END IF;
    END IF;
    IF entered THEN
        PERFORM pg_notify('pgclaim_claim_' || TG_RELID::text, val);
    END IF;
    RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_notify_on(tbl regclass, col name, val text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    kind  "char";
    typ   regtype;
    canon text;
    trig  text;
BEGIN
    IF tbl IS NULL OR col IS NULL OR val IS NULL THEN
        RAISE EXCEPTION 'pgclaim_notify_on: table, column and value must not be null'
            USING ERRCODE = '22004', HINT = 'SELECT pgclaim_notify_on(''items''::regclass, ''status'', ''PAUSED'')';
    END IF;
    SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = tbl;
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'pgclaim_notify_on: % is not a table (relkind %): only a table''s rows can be announced', tbl, kind
            USING ERRCODE = '42809';
    END IF;
    SELECT a.atttypid::regtype INTO typ
    FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgclaim_notify_on: table % has no column %', tbl, quote_ident(col)
            USING ERRCODE = '42703', HINT = 'name the state column the claims read (claim.Table.State)';
    END IF;
    BEGIN
        EXECUTE format('SELECT ($1::%s)::text', typ) INTO canon USING val;
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'pgclaim_notify_on: % is not a value of column %.% (type %): %', quote_literal(val), tbl, quote_ident(col), typ, SQLERRM
            USING ERRCODE = '22023', HINT = 'give the state rows are claimed from (claim.Config.From)';
    END;
    trig := 'pgclaim_notify_' || substr(md5(col || '=' || canon), 1, 12);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_ins', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_upd', tbl);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS pgclaim_new'
                || ' FOR EACH STATEMENT EXECUTE FUNCTION %I.pgclaim_notify_claimable(%L, %L)',
                   trig || '_ins', tbl, current_schema(), col, canon);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS pgclaim_old NEW TABLE AS pgclaim_new'
                || ' FOR EACH STATEMENT EXECUTE FUNCTION %I.pgclaim_notify_claimable(%L, %L)',
                   trig || '_upd', tbl, current_schema(), col, canon);
    EXECUTE format('COMMENT ON TRIGGER %I ON %s IS %L', trig || '_ins', tbl,
                   format('pgclaim: announces rows inserted with %I = %L (pgclaim_notify_off to detach)', col, canon));
    EXECUTE format('COMMENT ON TRIGGER %I ON %s IS %L', trig || '_upd', tbl,
                   format('pgclaim: announces rows updated into %I = %L (pgclaim_notify_off to detach)', col, canon));
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_notify_off(tbl regclass, col name, val text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    typ   regtype;
    canon text := val;
    trig  text;
    found_any boolean := false;
BEGIN
    SELECT a.atttypid::regtype INTO typ
    FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF FOUND THEN
        BEGIN
            EXECUTE format('SELECT ($1::%s)::text', typ) INTO canon USING val;
        EXCEPTION WHEN OTHERS THEN
            canon := val;
        END;
    END IF;
    trig := 'pgclaim_notify_' || substr(md5(col || '=' || canon), 1, 12);
    found_any := EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname IN (trig || '_ins', trig || '_upd'));
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_ins', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_upd', tbl);
    RETURN found_any;
END
$fn$;
-- +goose StatementEnd

-- Both attach functions name the trigger function with the schema they live
-- in: their search_path is fixed to it (current_schema() there).
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgclaim_notify_on(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgclaim_notify_off(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS pgclaim_notify_off(regclass, name, text);
DROP FUNCTION IF EXISTS pgclaim_notify_on(regclass, name, text);
DROP FUNCTION IF EXISTS pgclaim_notify_claimable() CASCADE;
