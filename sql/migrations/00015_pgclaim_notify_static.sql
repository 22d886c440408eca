-- The announcing trigger reads the state column by a statement planned once
-- per session, not per statement. Released migrations are never edited; add
-- a new file.

-- +goose Up
-- pgclaim_notify_fn(column, value, wanted) keeps the trigger function of
-- one column and value: pgclaim_notify_<hash>() in pgclaim's schema, whose
-- statements name the column and the value literally, so PL/pgSQL plans
-- them once per session (the generic pgclaim_notify_claimable of 00014
-- builds and plans them at every statement, which costs the claims' UPDATEs
-- tens of microseconds each). wanted creates it when missing and returns
-- its name; not wanted drops it once no trigger uses it. It runs as the
-- owner of pgclaim's schema, so that a table's owner without CREATE there
-- can attach; what it creates is fixed by its arguments, quoted.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_notify_fn(col name, canon text, wanted boolean) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
DECLARE
    fname text := 'pgclaim_notify_' || substr(md5(col || '=' || canon), 1, 12);
    qname text := format('%I.%I', current_schema(), fname);
    fid   oid;
BEGIN
    SELECT p.oid INTO fid FROM pg_proc p
    WHERE p.proname = fname AND p.pronamespace = current_schema()::regnamespace AND p.pronargs = 0;
    IF NOT wanted THEN
        IF fid IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgfoid = fid) THEN
            EXECUTE format('DROP FUNCTION IF EXISTS %s()', qname);
        END IF;
        RETURN qname;
    END IF;
    IF fid IS NOT NULL THEN
        RETURN qname;
    END IF;
    -- INSERT: rows entered when one has the value; UPDATE: when the
    -- statement left more rows with it than it found (a claim or a finish
    -- leaves none: one scan of the new rows decides).
    BEGIN
        EXECUTE format($body$
CREATE FUNCTION %1$s() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $trig$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgclaim_new WHERE %2$I::text = %3$L) THEN
        RETURN NULL;
    END IF;
    -- An INSERT trigger has no pgclaim_old: its statement is never read
    -- there.
    IF TG_OP = 'UPDATE' THEN
        IF (SELECT count(*) FROM pgclaim_new WHERE %2$I::text = %3$L)
        <= (SELECT count(*) FROM pgclaim_old WHERE %2$I::text = %3$L) THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify('pgclaim_claim_' || TG_RELID::text, %3$L);
    RETURN NULL;
END
$trig$$body$, qname, col, canon);
        EXECUTE format('COMMENT ON FUNCTION %s() IS %L', qname,
                       format('pgclaim: announces rows that enter %I = %L (pgclaim_notify_on; dropped by pgclaim_notify_off with the last trigger)', col, canon));
    EXCEPTION WHEN duplicate_function THEN
        NULL; -- attached at the same moment by another session
    END;
    RETURN qname;
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
    fn    text;
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
    fn := pgclaim_notify_fn(col, canon, true);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_ins', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig || '_upd', tbl);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS pgclaim_new'
                || ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', trig || '_ins', tbl, fn);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS pgclaim_old NEW TABLE AS pgclaim_new'
                || ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', trig || '_upd', tbl, fn);
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
    PERFORM pgclaim_notify_fn(col, canon, false);
    RETURN found_any;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgclaim_notify_fn(name, text, boolean) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgclaim_notify_on(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgclaim_notify_off(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- Tables attached since keep their triggers, which go on working; the
-- attach functions of 00014 come back with the previous release's code.
DROP FUNCTION IF EXISTS pgclaim_notify_fn(name, text, boolean);
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

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgclaim_notify_on(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgclaim_notify_off(regclass, name, text) SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd
