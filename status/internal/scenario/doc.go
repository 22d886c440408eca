// Package scenario fills a migrated database with what the status page
// shows, made by real schedulers and statements: a running run, a missed
// instant, a paused schedule, a failed run with a hostile reason, a job
// with a hostile name, a lease, an election's leader, and a claimed table
// with a stuck row. The tests of package status and its browser tests use
// it.
package scenario
