-- An error raised from inside a statement, so a claim can undo its own
-- insert. Released migrations are never edited; add a new file.

-- +goose Up
-- gate's ClaimTick inserts the tick first and takes the job's advisory lock
-- after: the insert meets a competing claim of the same tick in the primary
-- key, committed or still in flight (it waits for an uncommitted one), so
-- the statement alone decides "claimed already". When the insert won but
-- the lock is held by another run of the job, the tick must not stay
-- claimed: the statement calls pgclaim_raise, whose error aborts it and
-- with it the insert. The function is volatile and takes its arguments at
-- run time, so a plan never evaluates it in advance; it is only reached
-- on a branch that is taken.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgclaim_raise(code text, message text) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION pgclaim_raise(text, text) IS
    'pgclaim: raise an error with this SQLSTATE and message (aborts the calling statement)';

-- +goose Down
DROP FUNCTION IF EXISTS pgclaim_raise(text, text);
