// Package claim moves rows of your own tables through states by
// compare-and-swap, so that each row takes effect once even when the same job
// runs on several instances at the same time.
//
// # States
//
// A row's life is described by a handful of states in one column:
//
//	From (e.g. PAUSED) --claim--> To (e.g. PROCESSING) --finish--> Done / Failed / Retry.State
//	                      ^                |
//	                      +----release-----+     (and the sweeper: To --> Failed or Retry.State)
//
// A Claimer moves a row from From to To only if it is still in From
// (Claimer.Claim for one key, Claimer.ClaimBatch for up to n rows picked with
// FOR UPDATE SKIP LOCKED), stamping the claim columns: claimed_at (database
// time), claimed_by (the instance), a fencing token from pgclaim's sequence,
// and attempts+1. A row leaves To only by Claimer.Finish (to any other state),
// Claimer.Release (back to From) or a Sweeper, each a compare-and-swap on the
// state too.
//
// # Guarantees
//
//   - One holder at a time. Two claimers never both get a row: the loser of a
//     Claim gets ErrNotClaimed; concurrent ClaimBatch calls skip each other's
//     rows.
//   - Fencing. Finish, FinishBatch, Extend and Release act only if the row is
//     still in To with the claim's token; otherwise they return ErrLost (or
//     report the claim as lost) and change nothing. A holder whose row was
//     swept and claimed again — a zombie — can no longer touch it.
//   - Exactly-once effects in the database. Every operation can run in the
//     caller's transaction (Claimer.WithTx takes a pgx.Tx or any DBTX).
//     Finish the claim and write the effect in one transaction: both commit,
//     or neither does, and a lost claim writes nothing. The Worker does this
//     for each claim. Effects outside the database (an HTTP call, a push)
//     are at least once when retried: a holder that dies after the effect and
//     before the commit leaves the row to the sweeper, which moves it to
//     Failed or back for a retry.
//   - Nothing silently lost. Rows stuck in To because their holder died are
//     found by a Sweeper and moved to Failed, or back to a retry state while
//     attempts remain. The sweeper re-checks state and staleness on the
//     locked row, so a row finished a moment ago is never overwritten, and
//     two sweepers never move a row twice. Lost claims and swept rows are
//     logged (log/slog, to Config.Logger) and returned to the caller, and
//     every statement that moves rows or finds claims lost is reported to
//     Config.Hooks (an Event with its kind, target state, row count and
//     duration) for metrics and tracing; records and events alike carry the
//     caller's context.
//   - Database time only. Staleness and leases compare the server's clock
//     (statement_timestamp()), never the instance's.
//   - Deadlines shorter than the lease. A Worker with a lease counts each
//     claim held for three quarters of the lease after its last
//     confirmation; its claims, heartbeats and in-transaction finishes are
//     bounded by that, and the work of a claim not confirmed in time is
//     cancelled. A worker whose network goes silent stops processing a row
//     at least a quarter of the lease before another can claim it (see
//     Worker, and docs/RELIABILITY.md, "Silent network").
//   - Any isolation level. The guarantees hold whatever
//     default_transaction_isolation the database, role or pool sets: the
//     Worker begins its transactions READ COMMITTED, and a statement on a
//     pool that fails with 40001 above read committed is run again at read
//     committed. In a transaction of the caller's that runs above read
//     committed, a row changed after its snapshot gives an error naming
//     transaction_isolation instead (see Claimer.WithTx).
//
// # Tables
//
// A Table names the columns; Name, Key, State and ClaimedAt are required:
//
//	CREATE TABLE push_requests (
//	    id          bigint PRIMARY KEY,        -- Key: unique
//	    status      text NOT NULL,             -- State: text, varchar or an enum
//	    claimed_at  timestamptz,               -- ClaimedAt
//	    claimed_by  text,                      -- ClaimedBy (optional)
//	    fence       bigint,                    -- Fence (optional; needed to finish)
//	    lease_until timestamptz,               -- LeaseUntil (optional; leases)
//	    attempts    int NOT NULL DEFAULT 0,    -- Attempts (optional; retries)
//	    retry_at    timestamptz,               -- RetryAt (optional; delayed retries)
//	    reason      text                       -- Reason (optional; why a row failed)
//	);
//
// Features that need an optional column report which one when it is missing:
// Finish, FinishBatch, Release and the Worker need Fence; Extend and leases
// need LeaseUntil; retries need Attempts, and delayed retries
// (RetryPolicy.Backoff) RetryAt: a row is not claimed before its RetryAt.
// With Reason, the Worker records the error of a failed attempt and the
// Sweeper why it moved a stale row (its holder, fence and attempt, and
// whether its lease expired), so a FAILED row always says why. Without
// Fence, Claim and ClaimBatch still work as plain compare-and-swap claims,
// and finishing is left to the caller's own statements (see Each).
// Claimer.Verify checks the table against the spec at start-up, and that
// the states are labels of the state column's enum and allowed by its
// simple CHECK constraints; NewWorker and NewSweeper do the same for all
// their states (Worker.Verify, Sweeper.Verify) unless told to skip it
// (SkipVerify), and log a warning (ErrMissingIndex) when a partial index
// of the next section is missing. Names are
// identifiers, quoted, never SQL; only Config.Order, Config.Where and
// SweeperConfig.Where are SQL, and they are trusted input.
//
// Fencing tokens: every claim of every row, by Claim or ClaimBatch, stamps a
// fresh token from pgclaim_fence() (Claim.Fence): the server's WAL timeline
// times 2^48 plus the next value of pgclaim_fence_seq. No two grants get the
// same token, and a later grant gets a greater one, across server restarts
// and across the promotion of a standby, with asynchronous or synchronous
// replication alike: a promoted standby works on a new, higher timeline, so
// its tokens are above every token of the old primary, including those whose
// WAL it never received. So a token names one claim of one row; fenced
// statements check the pair (key, token), and a zombie of a lost primary
// cannot finish a row claimed again on the new one. For effects outside the
// database the idempotency key is the row's key, the same at every attempt
// (a token is new at each claim); a receiver can use the token to refuse a
// stale writer. What this needs of
// the server (synchronous_commit not off, one promotion per timeline) is in
// docs/claim.md.
//
// # Indexes
//
// Batch claims and sweeps select rows by state; give them partial indexes,
// or every batch rescans the rows already finished and the run slows as it
// goes:
//
//	CREATE INDEX ON push_requests (id) WHERE status = 'PAUSED';             -- ClaimBatch (index the Order columns)
//	CREATE INDEX ON push_requests (claimed_at) WHERE status = 'PROCESSING'; -- Sweeper
//
// The states these two statements select by (Config.From, and Config.To
// for the sweeper) are written into their text as literals, so that any
// plan of theirs can use the partial indexes: under pgx's default exec mode
// they are prepared statements like the others, and the generic plan the
// server caches after a few executions finds the rows through the index, as
// a plan made for the values does. Every pgx exec mode works, including
// the simple protocol.
//
// Every other statement — over the claims a caller holds, or the rows a
// batch claim or sweep has just locked — finds its rows through the key's
// unique index and reads only those, whatever the table's statistics say.
// That matters after a burst of claims: statistics taken while every row
// was PAUSED say that no row is PROCESSING.
//
// # Wake-ups
//
// A Worker on a *pgxpool.Pool claims the moment rows are announced, rather
// than at its next poll. Announce them with a trigger on the table, which
// every writer then uses (the application's code, another service, psql,
// a schedule resuming rows at 09:00): attach it once, as the table's owner,
// in the application's migration,
//
//	SELECT pgclaim_notify_on('push_requests'::regclass, 'status', 'PAUSED');
//
// (schema-qualify the function under pgclaim.WithSchema; pgclaim_notify_off
// with the same arguments detaches it). It sends one NOTIFY per statement
// that puts rows in the state — an INSERT of 10,000 rows is one — at
// commit, and nothing for a statement that rolls back. Without the
// trigger, call Notify in the writer's transaction.
//
// The workers of a process listen on one connection per pool, shared with
// every Worker and schedule.Scheduler on it (schedule.DedicatedSessions
// counts it). The listening sessions of the processes that work a table
// know one another (they announce themselves on its channel), and an
// announcement wakes one idle worker in two of them, chosen by the writer's
// backend pid alike in every process; a chosen process with no idle worker
// passes it on, and a worker that claimed a full batch wakes another, here
// or elsewhere. So one row inserted costs a few claim statements, not one
// per process (8 processes × 2 workers: 2 per row, 9 before). A row a
// worker sends back with a RetryPolicy.Backoff wakes it when the backoff
// ends. The poll stays as the safety net, at WorkerConfig.PollInterval: a
// lost announcement (the listening connection was down, the row was
// written without one) costs at most one poll, never a row; after the
// listening connection comes back, every worker claims once at once. While
// listening, the workers of a process that claim the same rows poll as
// one: a poll comes PollInterval after the latest claim of any of them, so
// idle workers cost one statement per PollInterval between them and busy
// ones none; the listening session itself checks its connection with a
// message that is no transaction.
// Behind a connection pooler in transaction mode LISTEN cannot work: the
// workers poll, and say so once in the log (`pgclaim doctor` tells which a
// DSN gets).
//
// # Three ways in
//
//   - Claimer: claim one or a batch, finish, extend, release — inside your
//     transaction when you want.
//   - Worker: a loop that drains From with bounded concurrency, runs your
//     function in the transaction that finishes each claim, extends leases
//     while it runs, retries failures, recovers panics, and on shutdown
//     leaves no row of its own in To.
//   - Each: for compare-and-swap statements you already have (for example
//     sqlc-generated :execrows methods): claim each candidate, skip the ones
//     another holder won, run the work, count.
//
// Run a Sweeper in every instance: Sweeper.Run sweeps at start-up and then
// periodically (Sweeper.Sweep is a single sweep, for a start-up that must
// wait for it). SweeperConfig.FailAfter sends stale rows claimed too long
// ago to Failed and the others back for a retry, in one sweeper.
package claim
