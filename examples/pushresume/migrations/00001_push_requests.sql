-- The push service's own tables. pgclaim's tables (ledger, locks, terms,
-- fencing sequence) come from pgclaim.Migrate; these come from this example's
-- own goose migrations, recorded in pushresume_schema_version.

-- +goose Up
-- One row per push request. A paused push waits in PAUSED until the 09:00
-- job resumes it; the claim columns are pgclaim's (claim.Table):
-- claimed_at/claimed_by/fence/lease_until/attempts are stamped by every
-- claim, and a finish only lands while fence still holds the claim's token.
CREATE TABLE push_requests (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload     text        NOT NULL,
    status      text        NOT NULL DEFAULT 'PAUSED'
        CHECK (status IN ('PAUSED', 'PROCESSING', 'SENT', 'FAILED')),
    paused_at   timestamptz NOT NULL DEFAULT now(),
    claimed_at  timestamptz,
    claimed_by  text,
    fence       bigint,
    lease_until timestamptz,
    attempts    integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    fail_reason text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (status <> 'PROCESSING' OR claimed_at IS NOT NULL)
);

-- The batch claim takes PAUSED rows in key order: without this index every
-- claim would rescan the rows already resumed.
CREATE INDEX push_requests_paused_idx ON push_requests (id) WHERE status = 'PAUSED';
-- The sweeper looks for PROCESSING rows by age (the 24-hour rule) and by
-- lease expiry.
CREATE INDEX push_requests_processing_claimed_idx ON push_requests (claimed_at) WHERE status = 'PROCESSING';
CREATE INDEX push_requests_processing_lease_idx ON push_requests (lease_until) WHERE status = 'PROCESSING';

-- updated_at follows every change, whoever makes it (claims, finishes and
-- sweeps are pgclaim's statements, which do not know the column).
-- +goose StatementBegin
CREATE FUNCTION push_requests_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER push_requests_touch BEFORE UPDATE ON push_requests
    FOR EACH ROW EXECUTE FUNCTION push_requests_touch();

-- One row per push handed to the provider: the "send" is this INSERT, written
-- in the transaction that finishes the claim. There is deliberately no unique
-- constraint on push_id: a duplicate send must show up as a second row, so the
-- demo can count duplicates instead of having a constraint hide them.
CREATE TABLE sent_pushes (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    push_id  bigint      NOT NULL REFERENCES push_requests (id),
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sent_pushes_push_id_idx ON sent_pushes (push_id);

-- +goose Down
DROP TABLE sent_pushes;
DROP TABLE push_requests;
DROP FUNCTION push_requests_touch();
