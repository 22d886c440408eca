// Package bouncer starts PgBouncer in transaction pooling mode on loopback
// in front of one database, for the chaos harness and the benchmarks, and
// supervises it: PgBouncer 1.18 (Debian 12) aborts on two of its own state
// checks under faults, and is started again on the same port then. It is
// part of pgclaim's harness (harness/README.md), not of its API: its names
// may change in any release.
package bouncer
