// Package shedlock is the baseline pgclaim's benchmarks compare its locks
// with: a lock table of ShedLock's schema, driven by ShedLock's PostgreSQL
// statements with database time (usingDbTime()). It imports no pgclaim
// package, so the benchmarks of any of them can use it. It is part of
// pgclaim's harness (harness/README.md), not of its API: its names may
// change in any release.
package shedlock
