-- Leadership terms (gate.Elector). Durations are passed in microseconds; all
-- times are the database's.

-- name: ElectionLock :exec
-- Block until the session advisory lock of an election is granted. Timeouts
-- a role or database may configure are lifted for this statement only: a
-- standby waits as long as the leader lives.
WITH t AS (
    SELECT set_config('lock_timeout', '0', true) AS a,
           set_config('statement_timeout', '0', true) AS b
)
SELECT pg_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) FROM t;

-- name: ElectionUnlock :one
SELECT pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)::boolean AS unlocked;

-- name: OpenTerm :one
-- The open term of an election, if any.
SELECT term, holder, method, started_at, lease_until
FROM pgclaim_terms
WHERE election = sqlc.arg(election)::text AND ended_at IS NULL;

-- name: StartAdvisoryTerm :one
-- started_at and ended_at here and below are read from clock_timestamp(),
-- not now(): now() is when the transaction began, which can precede the
-- commit of the term it follows, and recorded terms must never appear to
-- overlap.
-- Record a new term for the holder of the election's advisory lock. While
-- another term is open (its leader has not closed it yet) nothing is
-- inserted and no row returned, unless supersede is set: then the open term
-- is closed first, as superseded. A live lease term (an instance wrongly
-- using the lease variant in the same election) is never superseded.
WITH superseded AS (
    UPDATE pgclaim_terms
    SET ended_at = greatest(started_at, least(clock_timestamp(), lease_until)), end_reason = 'superseded'
    WHERE election = sqlc.arg(election)::text AND ended_at IS NULL AND sqlc.arg(supersede)::boolean
      AND (lease_until IS NULL OR lease_until <= now())
    RETURNING term
)
INSERT INTO pgclaim_terms (election, term, holder, method, started_at)
SELECT sqlc.arg(election)::text, pgclaim_fence(), sqlc.arg(holder)::text, 'advisory', clock_timestamp()
FROM (SELECT count(*) FROM superseded) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM pgclaim_terms o
    WHERE o.election = sqlc.arg(election)::text AND o.ended_at IS NULL AND NOT sqlc.arg(supersede)::boolean
)
ON CONFLICT (election) WHERE ended_at IS NULL DO NOTHING
RETURNING term, started_at;

-- name: StartLeaseTerm :one
-- Win the election if no unexpired term is open: close an expired term (it
-- ended when its lease ran out), then open a term leased until now() + ttl.
-- The partial unique index on open terms lets one of several racing
-- standbys win; no row returned means another one leads. A row returned
-- is not yet a term in force: StampTermStart confirms it (and refuses a
-- fence another term overtook while this statement stalled).
--
-- Every statement that closes a term sets ended_at to at least started_at
-- (greatest(started_at, ...)), so the row's CHECK (ended_at >= started_at)
-- can never refuse a close, whatever clock a start was stamped with: an
-- open row whose lease ran out can always be closed and taken over. Rows a
-- stamp once left starting after their lease end with ended_at =
-- started_at, a term that never was in force.
WITH expired AS (
    UPDATE pgclaim_terms
    SET ended_at = greatest(started_at, lease_until), end_reason = 'expired'
    WHERE election = sqlc.arg(election)::text AND ended_at IS NULL AND lease_until <= now()
    RETURNING term
)
INSERT INTO pgclaim_terms (election, term, holder, method, started_at, lease_until)
SELECT sqlc.arg(election)::text, pgclaim_fence(), sqlc.arg(holder)::text, 'lease',
       least(clock_timestamp(), now() + sqlc.arg(ttl_us)::bigint * interval '1 microsecond'),
       now() + sqlc.arg(ttl_us)::bigint * interval '1 microsecond'
FROM (SELECT count(*) FROM expired) AS e
WHERE NOT EXISTS (
    SELECT 1 FROM pgclaim_terms o
    WHERE o.election = sqlc.arg(election)::text AND o.ended_at IS NULL
      AND (o.lease_until IS NULL OR o.lease_until > now())
)
ON CONFLICT (election) WHERE ended_at IS NULL DO NOTHING
RETURNING term, started_at, lease_until;

-- name: StampTermStart :one
-- Set a new lease term's started_at to the time it is certainly in force.
-- StartLeaseTerm reads the clock before its insert is decided, which can be
-- after it waited for the previous term's close to commit; this statement
-- runs after that commit, so started_at follows the previous ended_at.
-- Only while the lease lasts: a candidate that stalled past its lease (a
-- saturated pool, a pause) gets no row and does not lead, and started_at
-- never passes lease_until.
--
-- Only while no term of the election has a higher number: StartLeaseTerm
-- draws its fence before its insert meets the open-term index, and judges
-- "no term open" by the snapshot its statement began with. A candidate that
-- stalls in between (its backend descheduled) can find, when it goes on,
-- that a whole term with a higher fence began and ended meanwhile; its
-- insert then succeeds, and leading with it would let fences fall. Such a
-- row is deleted here (it never was in force, and it is this candidate's
-- own) and no row returned: the candidate does not lead this time and
-- campaigns again, with a new fence. A higher-numbered row of the election
-- seen here was inserted and closed before this term's insert (the open-
-- term index keeps any other out while this one is open), so this never
-- refuses a term whose fence is the highest.
WITH later AS (
    SELECT EXISTS (
        SELECT 1 FROM pgclaim_terms n
        WHERE n.election = sqlc.arg(election)::text AND n.term > sqlc.arg(term)::bigint
    ) AS found
), outdated AS (
    DELETE FROM pgclaim_terms
    WHERE election = sqlc.arg(election)::text
      AND term = sqlc.arg(term)::bigint
      AND ended_at IS NULL
      AND (SELECT found FROM later)
)
UPDATE pgclaim_terms
SET started_at = least(clock_timestamp(), lease_until)
WHERE election = sqlc.arg(election)::text
  AND term = sqlc.arg(term)::bigint
  AND ended_at IS NULL
  AND lease_until > clock_timestamp()
  AND NOT (SELECT found FROM later)
RETURNING started_at;

-- name: RenewTerm :one
-- Extend this term's lease, only while it is open and unexpired. No row
-- returned: the term ended (expired, or closed by someone else).
UPDATE pgclaim_terms
SET lease_until = now() + sqlc.arg(ttl_us)::bigint * interval '1 microsecond'
WHERE election = sqlc.arg(election)::text
  AND term = sqlc.arg(term)::bigint
  AND ended_at IS NULL
  AND lease_until > now()
RETURNING lease_until;

-- name: EndTerm :execrows
-- Close this term. A lease term that already ran out ended when it expired.
UPDATE pgclaim_terms
SET ended_at   = greatest(started_at, least(clock_timestamp(), lease_until)),
    end_reason = CASE WHEN lease_until <= now() THEN 'expired' ELSE sqlc.arg(reason)::text END
WHERE election = sqlc.arg(election)::text
  AND term = sqlc.arg(term)::bigint
  AND ended_at IS NULL;

-- name: PruneTerms :execrows
-- Retention: delete the election's terms that ended before the limit. The
-- open term, and terms that ended since, stay.
DELETE FROM pgclaim_terms
WHERE election = sqlc.arg(election)::text
  AND ended_at IS NOT NULL
  AND ended_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond';

-- name: OpenAdvisoryTermsElsewhere :many
-- The open advisory terms of every other election: a candidate that waits
-- long for its lock looks among them for an election whose lock key
-- collides with its own.
SELECT election, holder, term
FROM pgclaim_terms
WHERE ended_at IS NULL AND method = 'advisory' AND election <> sqlc.arg(election)::text;
