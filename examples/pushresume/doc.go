// Command pushresume is pgclaim's field scenario end to end: a push service
// running as Active and Standby on one PostgreSQL database, whose 09:00 job
// resumes paused pushes, and whose every instance cleans up requests left
// PROCESSING by a crashed server when it starts.
//
// The job resumes the pushes in one statement (PAUSED → READY). The
// service's own migration attaches pgclaim's notification trigger to rows
// entering READY (migrations/00002_push_requests_ready.sql):
//
//	SELECT pgclaim_notify_on('push_requests'::regclass, 'status', 'READY');
//
// so the resume's commit announces the rows, and the claim worker every
// instance runs (READY → PROCESSING → SENT) starts sending within
// milliseconds rather than at its next poll, which stays as the safety net.
// PAUSED rows are in no state a worker claims: nothing is sent before 09:00.
//
// Run the demo (it provisions Postgres itself):
//
//	go run ./examples/pushresume
//
// See --help for the scenario and the flags. The hidden "instance"
// subcommand is one server of the service; the demo starts two of them as
// separate processes.
package main
