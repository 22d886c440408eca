-- Resumed pushes wait in READY for the instances' workers, which learn of
-- them from pgclaim's notification trigger (pgclaim_notify_on, from
-- pgclaim's migration 00014, which pgclaim.Migrate applies before these).

-- +goose Up
-- The 09:00 job resumes pushes in one statement, PAUSED → READY; every
-- instance runs a claim worker that takes READY rows (READY → PROCESSING →
-- SENT or FAILED). A paused push is in no state a worker claims, so nothing
-- is sent before 09:00.
ALTER TABLE push_requests
    DROP CONSTRAINT push_requests_status_check,
    ADD CONSTRAINT push_requests_status_check
        CHECK (status IN ('PAUSED', 'READY', 'PROCESSING', 'SENT', 'FAILED'));

-- The workers' batch claims take READY rows in key order; the resume finds
-- the PAUSED rows by paused_at (claims no longer read PAUSED).
CREATE INDEX push_requests_ready_idx ON push_requests (id) WHERE status = 'READY';
DROP INDEX push_requests_paused_idx;
CREATE INDEX push_requests_paused_at_idx ON push_requests (paused_at) WHERE status = 'PAUSED';

-- Announce rows entering READY, whoever moves them there: the resume, a
-- sweep giving back a dead instance's claims, a worker retrying a failed
-- send. One NOTIFY per statement, at its commit; the workers claim at once
-- instead of at their next poll, which stays as the safety net.
SELECT pgclaim_notify_on('push_requests'::regclass, 'status', 'READY');

-- +goose Down
SELECT pgclaim_notify_off('push_requests'::regclass, 'status', 'READY');
DROP INDEX push_requests_paused_at_idx;
CREATE INDEX push_requests_paused_idx ON push_requests (id) WHERE status = 'PAUSED';
DROP INDEX push_requests_ready_idx;
UPDATE push_requests SET status = 'PAUSED' WHERE status = 'READY';
ALTER TABLE push_requests
    DROP CONSTRAINT push_requests_status_check,
    ADD CONSTRAINT push_requests_status_check
        CHECK (status IN ('PAUSED', 'PROCESSING', 'SENT', 'FAILED'));
