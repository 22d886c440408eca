// Package gate makes scheduled and background work take effect once across
// several instances of a service sharing one PostgreSQL database.
//
// A cron job fires on every instance. gate decides, in the database, which
// one runs it:
//
//   - The tick ledger (Gate.Once) records each scheduled instant of a job
//     once in pgclaim_ticks. Every instance computes the same instant from
//     the shared schedule, and one INSERT … ON CONFLICT DO NOTHING decides
//     who runs it; the others get ErrSkipped, however early or late their
//     clocks fire. An instant further from database time than
//     Config.SkewTolerance is refused with ErrClockSkew (a *SkewError
//     carrying the database time). The ledger row records holder, fencing
//     token, start, finish and outcome.
//   - Advisory exclusion (Gate.Exclusive, and Gate.Once in the same
//     statement as the ledger insert) holds a session advisory lock for the
//     length of a run, so runs of a job never overlap. Another run gets
//     ErrHeld, at once or after Config.LockWait; from Once, a *HeldError
//     naming the run holding the lock.
//   - Catch-up (Gate.CatchUp) runs, at start-up, the latest instant missed
//     while every instance was down, once. The Gate deletes finished ticks
//     older than Config.Retention (7 days) itself; Gate.Prune deletes on
//     request.
//   - Lease locks (Lease) and leader election (Elector) cover places where
//     session locks cannot live, and Active/Standby deployments.
//     Elector.Prune keeps the record of election terms short.
//
// # Cost
//
// A Gate.Once cycle is two statements on one dedicated connection: the first
// is one INSERT … ON CONFLICT DO NOTHING of the tick (its fire time checked
// against database time) that, when the insert won, takes the advisory lock
// and probes for an abandoned tick in its RETURNING list (undoing the insert
// with an error when the lock is held elsewhere); the second records the
// outcome (a heap-only update) and unlocks in its RETURNING list. A tick
// claimed already costs one statement that returns no row, whether the claim
// that won it has committed or is still in flight: the insert waits for it in
// the primary key. Instances firing one tick together cost one statement each
// and the winner's finish. Exclusive is a try-lock (with a fencing token) and
// an unlock. The benchmarks in this package measure both side by side with a
// bare advisory lock cycle and a ShedLock lock-table cycle (ShedLock's table
// and statements with database time; BenchmarkOnceVsShedLock,
// BenchmarkExclusiveVsAdvisory, BenchmarkLeaseVsShedLock), and instances
// firing each tick together (BenchmarkOnceFiredTogether). A Once cycle costs
// about 1.3–1.4 ShedLock cycles (p50, measured in the same run): the
// difference is the ledger itself, a new row with its index entries and a
// fencing token per tick where ShedLock updates one row in place. The
// figures, and the floors no ledger of instants goes below, are in
// docs/BENCHMARKS.md.
//
// # Two ledgers of instants
//
// schedule's runs (pgclaim_schedule_runs) and this package's ticks
// (pgclaim_ticks) both record that an instant ran, and they stay two on
// purpose. A run belongs to a stored schedule: a row of pgclaim_schedules
// with its spec, time zone, version and pause state (the foreign key says
// so), and its runner records the instants itself from that definition,
// with attempts, leases, retries, and the overlap and catch-up policies. A
// tick belongs to a job whose schedule pgclaim never sees: the cron library
// of each process (robfig/cron, gocron) decides the instant, and the ledger
// accepts any instant within Config.SkewTolerance of database time, run once
// by whichever instance inserts it first, in two statements. Putting ticks
// in the runs table would mean runs without a stored schedule (the foreign
// key gone, and with it the guarantee that every run is one of a
// schedule's instants) or a stored schedule for every cron job (the
// process's own cron library no longer the one deciding). A service that
// wants one ledger moves its jobs from the adapters to schedule.Scheduler
// (docs/gates.md says how the two compare).
//
// # Advisory keys
//
// Locks use the two-int4 form pg_advisory_lock(AdvisoryClass, hash): see
// AdvisoryKey. The key of a name never changes between versions, and the
// two-int4 key space is separate from the bigint one most other users of
// advisory locks take theirs from.
//
// # Connections and lost locks
//
// A session advisory lock belongs to a connection, and a pooled connection
// returned to its pool keeps its locks. So a Gate takes one connection out
// of the pool (pgxpool.Conn.Hijack) and holds all its advisory locks on it,
// whatever the number of jobs, ticks or locks: a session may hold many, and
// the server drops them all at once when it ends. Statements on it run one
// at a time (taking or releasing a lock is one short statement); a caller
// waiting for a lock (Config.LockWait) tries again every 25 ms, leaving the
// session to the others meanwhile. Two runs of one process cannot be told
// apart by the server (a session takes a lock it holds again), so the Gate
// keeps them apart itself: a job whose lock a run of this process holds is
// skipped with ErrHeld, as if another instance held it. A lock is always
// released by an explicit pg_advisory_unlock whose result is checked; a
// session whose unlock is not confirmed is closed (which drops every lock on
// it) and the next lock opens another. Gate.Close closes it. A run whose
// lock was not confirmed in time on a session that is merely slow (a
// starved server or process) is cancelled, but the lock stays held until
// the run has ended and unlocked it: the shared session is closed only when
// it ended, or answered nothing for 15 s (longer than the server's own
// keepalive bound, so a silent network has cost the server the locks by
// then).
//
// Connection budget: a Gate holds DedicatedSessions (one) connection besides
// its pool, shared by every Gate and schedule.Scheduler of the process on
// the same pool; an Elector of the Advisory mechanism two of its own (the
// candidate's session and, while leading, a spare), Lease none. Jobs' own
// work goes through the application's pool.
//
// While locks are held and no statement runs, one goroutine blocks reading
// the session. A terminated backend or a server shutdown or restart closes
// it, which the read sees at once (within milliseconds in the tests): every
// running job's context is cancelled with a cause wrapping ErrLockLost,
// EventLost is reported, the ledger records the runs as lost, and Once or
// Exclusive return ErrLockLost once the job has returned. On the server
// side, the lock session sets TCP keepalives (the server drops a vanished
// client's session, and its locks, within about 11 s) and turns
// idle_session_timeout off.
//
// # Silent network
//
// A network that goes silent (connections open, nothing answered) cannot
// say whether the server still holds a lock, so every lock counts as held
// only for a bounded validity after its last confirmation (counted from
// when the confirming statement was sent), every statement that confirms
// or releases it is bounded by that validity, and a lock not confirmed in
// time is lost: the job's context is cancelled with ErrLockLost. The
// margins before another instance can start:
//
//   - Once and Exclusive: the watcher pings after a second of quiet and
//     the session counts as held for 3 s after the last answer, so the job
//     is cancelled 2–3 s after the network fell silent. The server frees
//     the lock no sooner than its keepalive gives up on the client, at
//     least 6 s after the silence: a margin of at least 3 s. After a
//     failover the promoted server holds no lock, and another instance may
//     start as soon as it accepts connections; Run.Fence is what refuses the
//     old job's writes then.
//   - Lease: AtMost/4 (or half of AtMost − KeepAlive, when shorter) before
//     the lease runs out in the database; see LeaseHandle.Context.
//   - Elector: the leader steps down 3/4 TTL after its last confirmation, at
//     least TTL/4 before a standby can lead (see ElectorConfig.TTL).
//
// Releases are bounded the same way: an unlock on the lock's shared session
// by 15 s (the session is closed instead, which frees the lock), a lease's
// release by AtMost, a term's close by TTL; an outcome written through the
// pool after a lost lock still gets up to 10 s. See docs/RELIABILITY.md,
// "Silent network", for the measured figures.
//
// # Abandoned ticks
//
// A holder that dies mid-run (a killed process, a session lost between claim
// and finish) cannot record an outcome, so its tick stays marked running.
// Every run under the advisory lock holds the lock until its outcome is
// recorded, so whoever takes a job's lock knows that no other run of the job
// is alive. The claim statement of Once and CatchUp (when not LedgerOnly)
// therefore also checks, with one index probe, whether the job's most
// recently started tick is still marked running: that is where a dead
// holder's tick is, since no tick of the job can be claimed while its
// holder holds the lock. If it is, a second statement, still under the lock,
// marks every running tick of the job abandoned, with finished_at and an
// error naming the instance that found it, and each is reported with
// EventAbandoned. A live run is never marked: it holds the lock, so the
// claim does not get it, and a run's finish records its outcome before it
// unlocks. If the old holder was not dead after all (its session ended
// while its process went on), its own outcome replaces the mark when its job
// returns. Ledger-only runs hold no lock, so nothing tells a dead one from a
// live one: their ticks are not resolved automatically (see
// Config.LedgerOnly), and instances of one job must all use the same mode.
//
// The server frees the lock as soon as the session is gone, possibly before
// the old job has noticed: another instance may then start while the old job
// is still winding down. Jobs should stop promptly when their context ends
// and pass Run.Fence to whatever they write, so stale writes can be refused
// (package claim does this for rows).
//
// # Poolers
//
// Behind PgBouncer in transaction mode, a session lock stays on a server
// connection other clients then use. When a lock connection is opened, the
// gate compares pg_backend_pid() with the pid announced at connect; a pooler
// announces its own, so they differ and the gate refuses with ErrPooler
// (session pooling is refused too). There, use Config.LedgerOnly, which
// needs no session state, and a Lease where runs must not overlap.
//
// # Isolation
//
// The gate's guarantees hold whatever default_transaction_isolation the
// database, role or pool sets. Its statements rely on READ COMMITTED
// re-checks (an insert that meets a concurrent claim of the same tick, a
// lease takeover, a term close), which REPEATABLE READ and SERIALIZABLE
// turn into SQLSTATE 40001 failures. So every statement runs at READ
// COMMITTED: the lock connections the gate owns set it as their session
// default when they are prepared. Through the pool, the gate asks each
// connection's default once, on its first use: where it is read committed
// a statement is sent as it is; elsewhere it is sent as BEGIN ISOLATION
// LEVEL READ COMMITTED, the statement and COMMIT in one batch (one round
// trip, one transaction). A plain statement that fails with a
// serialization failure, on a session whose default was changed since, is
// sent again that way (it changed nothing), as is every later one there. A
// skipped claim is ErrSkipped, a lease held elsewhere ErrHeld, at every
// level.
//
// # Observing
//
// The Logger (a *slog.Logger, slog.Default() when nil) and the Hooks of
// Config, LeaseConfig and ElectorConfig receive the same events: acquired, skipped, lost, finished with outcome and
// duration, and abandoned ticks found by a claim. Both get the context of the
// call the event belongs to (for a lock, lease or leadership lost as its
// watcher finds it, the values of the acquiring call's context), so a tracer
// or a context-aware log handler finds the caller's span and values there.
package gate
