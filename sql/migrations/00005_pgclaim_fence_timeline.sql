-- Fencing tokens that stay unique across a primary promotion. Released
-- migrations are never edited; add a new file.

-- +goose Up
-- Every grant (a claim of a row, a tick, an advisory run, a lease, an
-- election term, a schedule attempt) takes its token from pgclaim_fence():
--
--     token = timeline * 2^48 + nextval('pgclaim_fence_seq')
--
-- where timeline is the server's current WAL timeline, read from the name
-- of the WAL file at the current insert location (its first 8 hex digits;
-- pg_control_checkpoint() would lag a promotion by a checkpoint).
--
-- Why: a bare nextval is not enough across a promotion. The sequence logs
-- its state ahead in batches of 32, and a standby promoted after losing the
-- old primary's last WAL (asynchronous replication, or an advisory grant
-- that committed without waiting for the standby) resumes the sequence from
-- its last replayed record: it handed out again tokens the old primary had
-- already acknowledged. A promotion always moves to a new timeline with a
-- higher ID, so with the timeline in the high bits every token granted
-- after a promotion is greater than every token granted before it, whether
-- or not that grant's WAL reached the standby; within a timeline, tokens
-- increase in the order nextval hands them out. A token granted by a
-- superseded primary can therefore never equal, nor exceed, one granted by
-- its successor.
--
-- Bounds, each an error, never a wrap-around: the sequence stops at
-- 2^48 - 1 grants in its whole life (nextval: reached maximum value; the
-- counter is not reset by a promotion) — 89 years at 100,000 grants a
-- second; and a timeline ID of 32768 or more makes the product leave
-- bigint (bigint out of range): a promotion a day for 89 years.
--
-- The function is one SQL expression, inlined into every statement that
-- calls it, and evaluated once per granted row (both functions in it are
-- volatile, so nothing is folded into a cached plan).
-- +goose StatementBegin
DO $$
BEGIN
    -- Tokens granted before this migration are at most the sequence's
    -- last value; every token from now on is above 2^48 (timeline IDs
    -- start at 1), so above all of them. The counter needs room below its
    -- new maximum, 2^48 - 1.
    IF (SELECT last_value FROM pgclaim_fence_seq) >= 281474976710655 THEN
        RAISE EXCEPTION 'pgclaim: pgclaim_fence_seq is at %, past 2^48 - 1: tokens with the timeline would not stay above the ones granted so far',
            (SELECT last_value FROM pgclaim_fence_seq);
    END IF;
END
$$;
-- +goose StatementEnd
ALTER SEQUENCE pgclaim_fence_seq MAXVALUE 281474976710655 NO CYCLE;

CREATE OR REPLACE FUNCTION pgclaim_fence() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint * 281474976710656
           + nextval('pgclaim_fence_seq')
$$;
COMMENT ON FUNCTION pgclaim_fence() IS
    'pgclaim fencing token: WAL timeline * 2^48 + nextval(pgclaim_fence_seq); unique and increasing across primary promotions';

-- +goose Down
-- The old defaults: tokens are bare nextval values again. They restart
-- below every token granted while this migration was applied.
DROP FUNCTION IF EXISTS pgclaim_fence();
ALTER SEQUENCE pgclaim_fence_seq NO MAXVALUE;
