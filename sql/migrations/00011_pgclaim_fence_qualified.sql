-- pgclaim_fence() names its sequence with its schema. Released migrations
-- are never edited; add a new file.

-- +goose Up
-- pgclaim_fence() is an SQL function: its body is parsed at each call with
-- the caller's search_path, so nextval('pgclaim_fence_seq') found the
-- sequence only where pgclaim's schema is on that path. An installation in
-- a schema of its own (pgclaim.WithSchema) qualifies every statement and
-- leaves search_path alone (behind PgBouncer in transaction mode it is no
-- per-client setting), so the token's sequence is now named with the
-- schema pgclaim_fence_check() runs in (its fixed search_path): the bodies
-- of 00010, with the sequence qualified. Then pgclaim_fence() is written
-- again for the fence in force, with the same base: the tokens it grants
-- are those it granted before.
--
-- Rolling upgrades: the functions keep their names, arguments and results;
-- the previous release's statements run unchanged (docs/upgrades.md).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_fence_check() RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
DECLARE
    public_may boolean;
    tl         bigint;
    why        text;
    want       text;
    b          bigint;
    cur        pgclaim_fence_mode%ROWTYPE;
    found_cur  boolean;
    -- the sequence, qualified with this function's schema (its search_path)
    seq        text := format('%I.pgclaim_fence_seq', current_schema());
BEGIN
    public_may := has_function_privilege('public', 'pg_current_wal_insert_lsn()', 'EXECUTE')
              AND has_function_privilege('public', 'pg_walfile_name(pg_lsn)', 'EXECUTE');
    BEGIN
        tl := ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint;
    EXCEPTION WHEN OTHERS THEN
        why := format('the server refuses the WAL functions: %s (SQLSTATE %s)', SQLERRM, SQLSTATE);
    END;
    IF tl IS NOT NULL AND NOT public_may THEN
        why := 'EXECUTE on pg_current_wal_insert_lsn() or pg_walfile_name(pg_lsn) is not granted to PUBLIC';
    END IF;
    want := CASE WHEN tl IS NOT NULL AND public_may THEN 'timeline' ELSE 'sequence' END;

    FOR pass IN 1..2 LOOP
        SELECT * INTO cur FROM pgclaim_fence_mode;
        found_cur := FOUND;
        IF want = 'timeline' AND found_cur AND cur.fence = 'sequence' AND tl < cur.base THEN
            want := 'sequence';
            why := format('the server''s timeline (%s) is below the base of the tokens granted so far (%s)', tl, cur.base);
        END IF;
        IF found_cur AND cur.fence = want THEN
            IF want = 'timeline' AND tl > cur.base THEN
                UPDATE pgclaim_fence_mode SET base = tl;
            END IF;
            RETURN want;
        END IF;
        EXIT WHEN pass = 2;
        -- A switch: serialised with pgclaim's migrations (their advisory
        -- lock, MigrationLockID) and other instances' checks; then read
        -- again (a statement of its own, with a fresh snapshot at READ
        -- COMMITTED).
        PERFORM pg_advisory_xact_lock(31638874109340013);
    END LOOP;

    IF want = 'timeline' THEN
        b := tl;
        EXECUTE format($body$
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint * 281474976710656
           + nextval(%L)
$$$body$, seq);
        COMMENT ON FUNCTION pgclaim_fence() IS
            'pgclaim fencing token (timeline fence): WAL timeline * 2^48 + nextval(pgclaim_fence_seq); unique and increasing across primary promotions';
        why := 'PUBLIC may execute pg_current_wal_insert_lsn() and pg_walfile_name(pg_lsn)';
    ELSE
        b := greatest(1, tl,
            CASE WHEN found_cur THEN cur.base END,
            (SELECT max(fence) >> 48 FROM pgclaim_ticks),
            (SELECT max(fence) >> 48 FROM pgclaim_locks),
            (SELECT max(term) >> 48 FROM pgclaim_terms),
            (SELECT max(fence) >> 48 FROM pgclaim_schedule_runs));
        EXECUTE format($body$
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT %s::bigint * 281474976710656 + nextval(%L)
$$$body$, b, seq);
        COMMENT ON FUNCTION pgclaim_fence() IS
            'pgclaim fencing token (sequence fence): a constant * 2^48 + nextval(pgclaim_fence_seq); unique and increasing on one server and across failovers on shared storage, not across an asynchronous replica''s promotion';
    END IF;
    INSERT INTO pgclaim_fence_mode (fence, base, reason, decided_at)
    VALUES (want, b, why, clock_timestamp())
    ON CONFLICT (only_row) DO UPDATE
        SET fence = excluded.fence, base = excluded.base, reason = excluded.reason, decided_at = excluded.decided_at;
    RETURN want;
END
$fn$;
-- +goose StatementEnd
-- A SECURITY DEFINER function resolves names only in pgclaim's schema and
-- the catalog, never in a schema its caller controls (CREATE OR REPLACE
-- dropped the setting of 00010).
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION pgclaim_fence_check() SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $do$
DECLARE
    m   pgclaim_fence_mode%ROWTYPE;
    seq text := format('%I.pgclaim_fence_seq', current_schema());
BEGIN
    SELECT * INTO m FROM pgclaim_fence_mode;
    IF NOT FOUND THEN
        PERFORM pgclaim_fence_check();
        SELECT * INTO m FROM pgclaim_fence_mode;
    END IF;
    IF m.fence = 'timeline' THEN
        EXECUTE format($body$
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint * 281474976710656
           + nextval(%L)
$$$body$, seq);
    ELSE
        EXECUTE format($body$
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT %s::bigint * 281474976710656 + nextval(%L)
$$$body$, m.base, seq);
    END IF;
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- Nothing: the qualified bodies work wherever the unqualified ones did.
SELECT 1;
