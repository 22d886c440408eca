// Package status serves a status page of what pgclaim coordinates in one
// database: the stored schedules (next due in the database's time, their
// latest runs as a timeline with outcomes and attempts, missed, late and
// overdue instants, pauses with their note), the leaders of elections and
// their terms, lease and advisory locks with their holders, and claimed
// tables (rows per state, the oldest row in progress, stuck rows, the
// commonest failure reasons).
//
// The page is server-rendered by html/template from templates embedded in
// the binary: no JavaScript, no build step. It refreshes itself (a meta
// refresh; ?refresh=off stops it, for example while filling in a form),
// and every view is also served as JSON: append ".json" to its
// path or pass ?format=json. Everything read from the database — job
// names, holders, notes, failure reasons — is escaped by html/template.
//
// # Mounting
//
// New returns an http.Handler that serves paths relative to where it is
// mounted; mount it under a prefix with a trailing slash and
// http.StripPrefix:
//
//	mux.Handle("/pgclaim/", http.StripPrefix("/pgclaim", h))
//
// Its views are "/" (the schedules), "/schedules", "/leaders", "/locks"
// and "/claims"; links between them are relative.
//
// # Actions
//
// The handler is read-only unless Config.Actions is true. Then the page
// offers pause, resume, trigger, backfill (at most
// schedule.BackfillLimit instants) and cancelling a backfill for each
// schedule, and release for each held lease lock. Actions are POSTs to
// "/actions/NAME" carrying a CSRF token (a double-submit token: a random
// value in a SameSite=Strict, HttpOnly cookie that the form must repeat),
// and are refused when the browser marks them cross-origin
// (http.CrossOriginProtection). They run the same code as the pgclaim CLI:
// schedule.Scheduler's Pause, Resume, Trigger, Backfill and
// CancelBackfill, and the fenced release of a lease (only while it still
// carries the fencing token the page showed).
//
// # Security model
//
// What is anonymous: every GET. An anonymous viewer sees the schedules,
// their runs and reasons, leaders, leases, advisory locks without their
// sessions, and claimed tables; a failed read shows its SQLSTATE, not the
// connection's user, database, host and port. Everything from the
// database is escaped; the page sends CSP default-src 'none', nosniff and
// frame DENY, and runs no script.
//
// What needs authentication: the handler does not authenticate. Wrap it
// in the application's own authentication and authorisation middleware
// and tell it what the middleware decided: Config.Authenticated (who sees
// the action forms, sessions and full errors; the others' POSTs are
// refused with 401) and Config.Operator (the name recorded with a pause or
// a cancelled backfill and logged with every action; the form cannot name
// anyone), for example
//
//	page, _ := status.New(status.Config{Pool: pool, Actions: true,
//		Authenticated: func(r *http.Request) bool { return userOf(r) != nil },
//		Operator:      func(r *http.Request) string { return userOf(r).Email },
//	})
//	mux.Handle("/pgclaim/", withUser(http.StripPrefix("/pgclaim", page)))
//
// Without Config.Authenticated anyone who can reach the handler can act
// when Actions is true: put it behind requireAdmin-style middleware.
//
// Bounds: at most Config.MaxReads views are read at once (others get 503),
// each statement under Config.QueryTimeout; large claimed tables are
// estimated from a sample (Table.EstimateAbove), and the page says so.
//
// The command "pgclaim serve" serves this handler on a loopback address,
// read-only unless given an action token (checked for strength at
// start-up, compared by digest): logging in at /login with it starts a
// signed session that expires (and ends at /logout); failed logins are
// logged and slowed down; bodies and the server's reads and writes are
// bounded in size and time; --tls-cert and --tls-key serve HTTPS, and off
// loopback without them it warns that the token travels in clear text.
package status
