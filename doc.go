// Package pgclaim lets a service run in several instances against one
// PostgreSQL database without any scheduled or background work taking effect
// twice. Everything it coordinates lives in Postgres.
//
// The work is split into layers, each covering the holes of the others:
//
//   - package gate: a tick ledger so each scheduled instant runs once across
//     all instances (with catch-up of a missed tick), exclusion while a job
//     runs (a session advisory lock, or a lease row where session locks cannot
//     live), and leader election for Active/Standby deployments;
//   - package claim: per-row compare-and-swap claims on the caller's own
//     tables (PAUSED → PROCESSING → DONE/FAILED) with fencing tokens, a worker
//     loop, and a stale sweeper every instance runs at start-up;
//   - package pgtest: a real, migrated PostgreSQL database for tests.
//
// This root package applies pgclaim's own schema. Call [Migrate] at start-up
// in every instance (it is safe to call concurrently), before using gate or
// claim. [MigrateFS] applies the application's own goose migrations the same
// way, with a version table and lock key of the application's own, so the
// two sets never mix. For an application's sqlc schema, 'pgclaim schema
// --out DIR' (command github.com/pgclaim/pgclaim/cmd/pgclaim) writes
// pgclaim's migration files.
package pgclaim
