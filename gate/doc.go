// Package gate makes scheduled and background work take effect once across
// several instances of a service sharing one PostgreSQL database.
//
// It offers, in layers:
//
//   - a tick ledger: each (job, scheduled instant) runs once, decided by one
//     INSERT … ON CONFLICT DO NOTHING into pgclaim_ticks;
//   - advisory exclusion: a session-level advisory lock held on a dedicated
//     connection while the job runs, watched so the job is cancelled the
//     moment the session is lost;
//   - a lease lock and a leader elector for places where session locks
//     cannot live (PgBouncer transaction pooling) and for Active/Standby.
//
// Shared settings are in Options; every mechanism reports to a Hooks and a
// *slog.Logger.
package gate
