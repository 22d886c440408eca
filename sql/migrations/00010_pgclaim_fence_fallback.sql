-- A fencing token where the WAL control functions are refused. Released
-- migrations are never edited; add a new file.

-- +goose Up
-- pgclaim_fence() (00005) reads the WAL timeline with
-- pg_walfile_name(pg_current_wal_insert_lsn()). Where those functions are
-- refused (Aurora refuses them outright; a DBA may revoke EXECUTE from
-- PUBLIC) every grant of a token failed, so every claim, tick, lease and
-- schedule run failed. A function's privileges are checked when a
-- statement that names it starts, whether or not the branch calling it is
-- taken, so the fallback cannot be a branch of one expression: pgclaim
-- keeps one of two bodies of pgclaim_fence(), chosen by
-- pgclaim_fence_check(), and records which in pgclaim_fence_mode:
--
--   timeline: token = timeline * 2^48 + nextval('pgclaim_fence_seq'), where
--             the timeline is read from the server at each grant. Unique
--             and increasing across every primary promotion, including an
--             asynchronous standby's (see 00005).
--   sequence: token = base * 2^48 + nextval('pgclaim_fence_seq'), base a
--             constant. Unique and increasing on one server, across its
--             restarts, and across a failover whose new primary reads the
--             same storage (Aurora, RDS Multi-AZ instances, a shared or
--             replicated-block disk): the sequence never goes back there.
--             Across the promotion of a physical streaming replica it holds
--             only when every token was replicated before the promotion
--             (synchronous replication); an asynchronous standby may hand
--             out again tokens the old primary granted.
--
-- The timeline fence is chosen when PUBLIC may execute both functions (an
-- application role may be any role) and the server answers them; the
-- sequence fence otherwise. Both keep tokens above every token granted
-- before: a switch to the sequence fence takes as base the highest
-- timeline known (the server's, the one recorded, those in the tokens of
-- pgclaim's own tables), and a switch back to the timeline fence happens
-- only when the server's timeline is at least that base.
--
-- pgclaim.Migrate calls pgclaim_fence_check() at every start-up, so a
-- database restored onto a server that refuses the functions, or whose
-- privileges changed, is switched before the application's first grant.
-- It is SECURITY DEFINER (it replaces pgclaim_fence(), which its owner
-- owns), so an application role that cannot create anything may call it.
CREATE TABLE IF NOT EXISTS pgclaim_fence_mode (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    fence      text        NOT NULL CHECK (fence IN ('timeline', 'sequence')),
    -- timeline: the highest timeline read so far; sequence: the constant
    -- high part of every token.
    base       bigint      NOT NULL CHECK (base >= 1 AND base < 32768),
    reason     text        NOT NULL,
    decided_at timestamptz NOT NULL
);
COMMENT ON TABLE pgclaim_fence_mode IS
    'pgclaim: which fencing token pgclaim_fence() grants (timeline or sequence), chosen by pgclaim_fence_check()';

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
        EXECUTE $body$
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint * 281474976710656
           + nextval('pgclaim_fence_seq')
$$$body$;
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
    SELECT %s::bigint * 281474976710656 + nextval('pgclaim_fence_seq')
$$$body$, b);
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
COMMENT ON FUNCTION pgclaim_fence_check() IS
    'pgclaim: choose the fencing token pgclaim_fence() grants (timeline where PUBLIC may read the WAL timeline, sequence otherwise), record it in pgclaim_fence_mode, and return it';
-- A SECURITY DEFINER function resolves names only in pgclaim's schema and
-- the catalog, never in a schema its caller controls.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION pgclaim_fence_check() SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
SELECT pgclaim_fence_check();

-- +goose Down
-- Back to the timeline fence of 00005.
CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint * 281474976710656
           + nextval('pgclaim_fence_seq')
$$;
DROP FUNCTION IF EXISTS pgclaim_fence_check();
DROP TABLE IF EXISTS pgclaim_fence_mode;
