// Package chaos is pgclaim's fault-injection suite. It proves, by counting
// effects, that double firing cannot cause double effects: a harness starts
// a Postgres server it controls (with Config.Patroni, a Patroni cluster
// whose primary it switches over, kills and silences), runs several instance processes of a
// worker built on pgclaim (one-second schedules run by package schedule, batch claims
// finished with their effects, sweeps, leader election), injects faults on
// a seeded schedule, and a checker verifies the invariants on the final
// state of the database. The command is ./harness/chaos/cmd/chaos; see
// docs/RELIABILITY.md for the fault model and the guarantees. It is part of
// pgclaim's harness (harness/README.md), not of its API: its names may
// change in any release.
package chaos
