// Package bench measures pgclaim against the alternatives its users would
// pick instead, side by side on one PostgreSQL server in one run: row claims
// against the field's SELECT-then-CAS loop and a single bulk UPDATE, gate
// cycles against a ShedLock-style lock table and a bare advisory lock, the
// stale sweeper against one giant UPDATE, leader failover against a polling
// standby, claim latency as the table grows, the scheduler's idle cost,
// cost per instant and wake-up lag against gate.Once, many jobs due at one
// instant against River's periodic jobs, and how soon an idle claim worker
// starts a new row against River's client. It is part of pgclaim's harness
// (harness/README.md), not of its API: its names may change in any release.
//
// It is the engine of the `pgclaim bench` command. Absolute figures depend on
// the machine and drift between runs; the ratios measured within one run are
// what to read.
package bench
