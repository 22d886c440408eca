// Package schedule runs cron schedules stored in PostgreSQL: every
// instance of a service runs the same Scheduler over the same rows, and
// each due instant of a schedule completes exactly once — or is recorded
// failed or skipped, saying why — never silently not at all.
//
//	s, _ := schedule.New(pool, schedule.Config{})
//	_ = s.Register(ctx, schedule.Definition{
//		Name: "push-resume", Spec: "0 9 * * *", TimeZone: "Europe/Berlin", Version: 1,
//	}, resumePushes)
//	_ = s.Run(ctx) // blocks
//
// # Exactly once
//
// "Exactly once" means, per (schedule, instant):
//
//   - at most one attempt is recorded succeeded;
//   - every instant that came due ends succeeded, failed (after its
//     attempts, with the last error as reason) or skipped (by a stated
//     policy, with the reason): a row in pgclaim_schedule_runs says which;
//   - an instant is never in the ledger twice, and at most one attempt of
//     it runs with a valid fence at a time.
//
// It does not mean a job's effects happen once by themselves: an attempt
// that died (its process killed, its session or lease lost) may have done
// part of its work before the next attempt starts over. Jobs therefore do
// their work through claims (package claim: each row moved once, fenced),
// or idempotently keyed by Run.Instant, or pass Run.Fence to the systems
// they write to so a stale attempt is refused there.
//
// # Tables
//
// pgclaim_schedules holds one row per schedule: its definition (spec,
// zone, catch-up, overlap and retry policies, expected duration, late
// threshold, jitter, lease, version), when its life began (starts_at: instants at or before it were
// never due) and its pause state. pgclaim_schedule_runs holds one row per
// (schedule, instant) — the primary key, as DBOS keys scheduled workflows
// by name and scheduled time — with its kind (scheduled, triggered,
// backfill), state (pending, running, retrying, succeeded, failed,
// skipped), attempt, fence, holder, lease, next attempt time, delayed
// start (jitter), reason, and whether it was missed, late or overdue.
// Fences come from pgclaim_fence(), shared with the rest of pgclaim: a
// later attempt's fence is greater, across primary promotions too.
//
// # Registration
//
// Scheduler.Register stores a Definition. Blue/green deployments run two
// versions of a service at once, possibly with different definitions of a
// schedule, and must not flap between them. The rule: a definition carries
// a Version (≥ 1, raised with each change) and replaces the stored one
// only when its version is strictly higher; the INSERT … ON CONFLICT DO
// UPDATE … WHERE stored.version < new.version re-checks the newest row, so
// the stored version only ever moves up, whatever order the instances
// start in. An instance whose definition differs from the stored one (a
// lower version, or an equal version with other settings) follows the
// stored one, logs a warning naming the fields that differ (at an equal
// version: raise Version to replace it) and reports EventFollowed: refusing instead
// would stop the old deployment's scheduler during the very switch the
// rule exists for. The pause state is operational and never written by
// registration. A new version that keeps the spec and zone keeps
// starts_at; one that changes them starts a new life, so the new spec's
// instants before the change are never due.
//
// # The scheduler
//
// Run sleeps with a timer until the next instant of any schedule it runs
// (computed from the stored definition; the timer is set from the host
// clock corrected by the database's time as last read, but every due
// decision reads now() from the server), or until a notification or a
// poll says a run waits. No busy polling: besides the instants, an idle
// instance sends one statement per Config.PollInterval (default 1 s) for
// all its schedules, through the pool, as a transaction of its own.
//
// To run a schedule, an instance takes the schedule's lock (see Locks).
// Holding it, it is the schedule's runner: it records the instants that
// came due since the last one recorded, decides each by the catch-up and
// overlap policies (a row per instant, pending or skipped), starts the
// oldest run that can start (a pending run, a retry whose time has come,
// a run whose holder died) as the next attempt — a compare-and-swap on its
// state and fence that bumps attempt and issues a fresh fence — runs the
// job, and records the outcome with another compare-and-swap on the
// fence. While the job runs it keeps the run's lease renewed and goes on
// recording the instants that come due (overlap policy). When nothing is
// left to start it releases the lock. Instances that find the lock held do
// nothing for that schedule: its runner records what comes due.
//
// Many schedules due at once: an instance attends at most
// Config.MaxConcurrent schedules at a time (default 100), leaving the rest to
// instances with room. With the default locks, an instance takes the locks
// of the schedules due at one moment in one statement, up to its room, in
// name order: each lock goes to the first instance that tries it, as SKIP
// LOCKED shares out rows, so the instances split the schedules between
// them without trying the same ones. For each schedule it took that is as
// it last read it (same version, not paused, the instant before recorded,
// nothing unfinished) one more statement, for all of them, seizes the
// leases, records the instants and starts their first attempts; whatever
// that statement finds changed goes the usual way: the schedule's state is
// read and decided by its policies. While more are due than it has room
// for, it asks in one statement (at most every 100 ms) which of the others
// another instance holds or has already run, and gives the slots that free
// up to the runs nobody has started. The runners it attends at the same
// moment share their other statements too — reading the schedules and
// their open runs, seizing, recording, claiming, recording the outcomes,
// releasing — each in one statement for every runner waiting for it (over
// arrays, each row still checking its own schedule's fence), sent as soon
// as the previous one of its kind has answered; outcomes and releases
// gather for 5 ms first. So 500 schedules due at one instant on 8
// instances start in two statements per instance that runs them: about
// 920 transactions for the instant, the jobs' own 500 inserts, outcomes,
// releases and polls included, where River's periodic jobs take 870
// (docs/BENCHMARKS.md, herd).
//
// # Locks
//
// By default the lock is a session advisory lock (two-int4 key from
// gate.AdvisoryKey of "pgclaim.schedule:"+name) together with the
// schedule's lease row in pgclaim_locks. The advisory locks of all the
// schedules an instance runs are held on one connection taken out of the
// pool (a session holds any number of them) and watched while held. The
// locks of the schedules due at the same moment are taken in one statement
// on it (pg_try_advisory_lock over an array of keys), and released in one,
// so hundreds of schedules due at the top of the hour do not queue for the
// session one round trip each. The
// server drops them the moment the holder's session ends, so another
// instance takes a dead holder's run over at once, as attempt n+1 with a
// fresh fence, when its poll or next instant finds the lock free. The
// instance that gets the advisory lock then seizes the lease row with a
// fresh fence (the previous holder's session has ended, whatever its
// lease said), and the runner's statements go through the pool, each
// checking that fence: a runner that lost its lock changes nothing. A
// terminated backend cancels the running jobs' contexts at once (cause
// wraps ErrLost).
//
// Connection budget: a running Scheduler holds DedicatedSessions (two)
// connections besides its pool: the lock session (shared with every Gate
// on the same pool) and the listening one (shared with every Scheduler and
// claim.Worker on the same pool).
// Everything else, jobs included, goes through the pool, so an instance
// holds at most its pool's MaxConns + DedicatedSessions connections whatever
// the number of schedules (with LeaseLocks, MaxConns alone).
//
// With Config.LeaseLocks (for PgBouncer transaction pooling, where session
// locks and LISTEN cannot work) the lock is a lease row in pgclaim_locks
// renewed every Lease/3; a dead or stalled holder's run is taken over once
// the lock's lease has expired (database time) and another instance has
// taken the lock: a run started under an earlier grant of the lock (its
// fence is older than the lock's) is dead, whether or not its own lease
// has run out yet. Its job's context is cancelled when a renewal of
// either lease cannot be made in time, which is before the database lets
// anyone else take the lock. Notifications are not
// used; the poll bounds every latency.
//
// Bounds. A holder killed (SIGKILL) or whose backend ends: its run is taken
// over within Config.PollInterval (or by the next instant, whichever comes
// first) of the server ending the session, which the server notices at once
// for a killed process; with LeaseLocks, within Definition.Lease plus
// Config.PollInterval of the lock's last renewal (the poll that finds the
// lock expired takes it and the run at once). In the chaos short run (1 s
// poll, 2 s lease, faults every few seconds on a loaded 2-core machine) the
// next attempt of a SIGKILLed runner's instant started p50 2.0 s, max 5.3 s
// after the kill. A holder that is only stopped (SIGSTOP, a GC or VM pause)
// keeps its session, and with it the advisory lock, until it resumes or the
// server drops the connection; its run is not taken over meanwhile, and when
// it resumes its attempt either completes (still holding the lock) or, having
// lost it, is refused. A stop longer than the lock's validity (below) makes
// it count the lock lost when it resumes: it cancels the run, then unlocks
// on the session, which stays open with every other lock of the process (a
// slow answer is not a lost session; a session silent for 15 s is
// closed).
//
// Silent network. A holder whose network goes silent (the connections stay
// open, nothing is answered) cannot tell whether the server still holds its
// lock, so each confirmation of the lock holds it for a bounded validity,
// counted from when the confirming statement was sent: 9/10 of
// Definition.Lease, and for a session lock at most 3 s (internal/lockcore's
// SessionValidity). Every statement run under the lock, the lock's own
// statements and the run's lease renewals are bounded by it, the lock's
// session is pinged after a second of quiet (or a third of the validity),
// and a lock or run lease not confirmed within it is lost: the run's
// context is cancelled, and the lock is still held until the run has ended
// and unlocked it. The margin before another instance can start the
// run: with LeaseLocks, Lease/10 before the lease runs out in the
// database; with a session lock, at least 3 s before the server's TCP
// keepalive can free the lock (at least 6 s after the silence began), and
// none after a failover, where the run's fence refuses the old attempt's
// completion. See docs/RELIABILITY.md, "Silent network".
//
// Only the holder of a schedule's lock records instants and starts or
// takes over attempts: those statements check the lock's lease fence in
// the statement. A runner that lost its lock without noticing yet changes
// nothing.
//
// A zombie — an attempt that kept running after its run was taken over —
// cannot complete: its finish is a compare-and-swap on a fence that is no
// longer the run's. It changes nothing, and is reported as EventLost with
// an error wrapping ErrLost, logged at warn level.
//
// # Attempts and retries
//
// A job that returns an error or panics has failed its attempt. While
// attempts remain (RetryPolicy.MaxAttempts, default 3) the run waits in
// state retrying until now() + the back-off (Backoff after the first
// failure, doubling up to MaxBackoff), then any instance runs the next
// attempt; after the last it is recorded failed with the error as reason.
// An attempt whose holder died counts as an attempt; a dead run with no
// attempts left is recorded failed, naming the dead holder. An attempt
// interrupted by its own scheduler's shutdown is handed back at once: once
// its lock is released, the other instances are told by NOTIFY (by their
// poll with Config.LeaseLocks), and one of them runs the next attempt.
//
// # Policies
//
// Instants that came due while no instance ran the schedule, or while it
// was paused, are decided at the next look by the catch-up policy. An
// instant is on time when it is the newest due instant and is recorded
// within Config.Grace (default 30 s) of it; every other unrecorded due
// instant is missed. CatchUpNone records each missed instant skipped;
// CatchUpLatest runs the newest (if inside CatchUpWindow) and records the
// others skipped; CatchUpAll runs those inside CatchUpWindow, at most
// CatchUpCap (the newest), oldest first, each once, and records the rest
// skipped. Instants due during a pause are decided the same way at resume
// (their reasons say "paused") and are not reported missed.
//
// An instant that comes due while the previous run is still running or
// waiting for its retry is decided by the overlap policy: OverlapSkip
// records it skipped, naming that run; OverlapBufferOne keeps one pending,
// which runs when the current run ends, and records further ones skipped;
// OverlapBufferAll keeps every one pending, to run oldest first;
// OverlapReplace records the previous run skipped, naming the new instant
// (a compare-and-swap on its state and fence, so its fence is stale from
// then on), cancels its attempt's context (the cause wraps ErrLost), and
// runs the new instant at once; the cancelled attempt's completion, should
// it come, changes nothing and is reported as EventLost. Run waits for
// such an attempt to return before it returns.
//
// Definition.Jitter delays each scheduled instant's start by an amount up
// to it, fixed per instant (a hash of the name and the instant): the
// instant is recorded on time with the delayed start (start_after), which
// the claim, the poll and the runner's wake-up all respect, by database
// time. The instant stays the key and Run.Instant; lateness is measured
// from the delayed start.
//
// # Missed instants
//
// An instant that was due (after starts_at, outside the latest pause) and
// has no row after Config.Grace is missed. The runner that finds one
// reports EventMissed and records it by the catch-up policy, marking the
// row missed. The hooks hear of each instant; the log gets one warning per
// schedule for the instants recorded together (how many, the first and
// the last, the policy's reason), each instant at debug level: after a
// downtime a line per instant would bury what matters. Scheduler.Missed lists, from the database
// alone, the missed instants no instance has recorded yet — when every
// instance is down, that is the only place they show.
//
// # Late and overdue
//
// A run whose first attempt starts more than Definition.LateAfter
// (default 10 s) after its instant (its delayed start, with jitter), by
// database time, is late: the claim
// that starts it marks the row late, and the instance reports EventLate (a
// warning) with how late it started. Catch-up runs are late by nature, and
// a triggered run that waited (paused, or every instance busy) is too;
// backfilled runs never are. An attempt still running
// Definition.ExpectedDuration (when set) after it started, by database
// time, is overdue: its instance marks the row overdue and reports
// EventOverdue (a warning), once per attempt; the attempt goes on running.
// Both flags stay on the row, for operators and the CLI to count.
//
// # Pause, resume, trigger
//
// Pause, Resume and Trigger write one row and notify every instance
// through LISTEN/NOTIFY on channel pgclaim_schedules (the process's one
// listening connection for the pool); a missed
// notification is covered by the poll, so every instance hears within
// Config.PollInterval at worst (a trigger reached a waiting instance in a
// median 7–13 ms by NOTIFY in the tests, about 1 s by the poll alone). Once a pause
// is committed no attempt starts anywhere: the claim itself reads it. A
// running attempt finishes. Trigger records a run of kind triggered at the
// database's time; while one is open, Trigger returns it, so two
// operators triggering together get one run.
//
// # Tests
//
// Scheduler.RunAt runs a registered schedule's instant now, synchronously,
// as the scheduler would have run it at that instant: recorded as a
// scheduled run, claimed with a fence under the schedule's lock, retried by
// its policy; it returns the run as recorded (a RunRecord), ErrRecorded
// (running nothing) for an instant already in the ledger, ErrPaused for a
// paused schedule. Scheduler.WaitRun waits for the end of a run the
// service's own scheduler makes. A test thus checks "the 09:00 job" without
// waiting for 09:00, and without a backfill (kind backfill, cut at the
// scheduler's frontier).
//
// # Retention
//
// A running Scheduler deletes the finished runs of the schedules registered
// with it once they are older than Config.Retention (DefaultRetention, 7
// days, unless set; Definition.Retention per schedule; KeepRuns keeps them
// all): a minute after Run starts, then every 10 minutes, 1,000 rows per
// statement, each bounded to 5 s, logging one line per schedule that lost
// runs. Each pass stores the age it applied (Status.Retention, shown by the
// CLI and the status page). A schedule whose CatchUpWindow is as long as its retention keeps
// its runs (Register warns). Scheduler.Prune deletes finished runs older
// than a given age on request, by database time, never an open one. Each schedule keeps the newest scheduled instant
// pruned (pruned_until): instants up to it are never recorded again by
// catch-up nor reported missed, so pruning cannot make an instant run
// twice. Prune refuses an age within any stored schedule's catch-up
// window (ErrInvalid naming olderThan and the schedule).
//
// # Isolation
//
// Every statement the package sends through the pool runs at READ
// COMMITTED, and the lock and listening connections set their session
// default to read committed (store.SessionSetup), whatever
// default_transaction_isolation the database, role or pool sets. The
// runner's statements through the pool (a lease's, a run's renewal, an
// outcome, the poll) are each a transaction of their own: sent plain, one
// round trip, on a connection whose session default is read committed
// (asked once per connection), and otherwise as BEGIN ISOLATION LEVEL READ
// COMMITTED, the statement and COMMIT in one round trip. The operations
// (Register, Pause, Backfill, ...) run in explicit READ COMMITTED
// transactions.
package schedule
