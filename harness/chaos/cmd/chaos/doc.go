// Command chaos runs pgclaim's fault-injection suite: a Postgres server it
// controls, several instance processes of a worker built on pgclaim, and
// faults on a seeded random schedule (SIGKILL, pg_terminate_backend,
// Postgres restarts, clock offsets, SIGSTOP pauses, schedule pauses,
// PgBouncer in transaction pooling mode; with --patroni, a Patroni cluster
// and its switchovers, failovers and silent hosts). After the faults stop it checks that nothing
// took effect twice, nothing was lost and no two leaders overlapped, prints
// a table, and exits 1 on any violation (printing the seed to replay). It
// is part of pgclaim's harness (harness/README.md), not of its API.
//
//	go run ./harness/chaos/cmd/chaos                  # short run (2m)
//	go run ./harness/chaos/cmd/chaos --duration 20m   # soak
//	go run ./harness/chaos/cmd/chaos --seed 42        # replay a schedule
//	go run ./harness/chaos/cmd/chaos --patroni --sync # Patroni failovers
//
// See docs/RELIABILITY.md.
package main
