// Command pgclaim is the operator's tool for pgclaim: it applies pgclaim's
// migrations and shows and repairs what pgclaim coordinates in a database.
//
//	pgclaim migrate up|status     apply pgclaim's migrations, or list them
//	pgclaim ticks                 recent runs recorded in the tick ledger
//	pgclaim locks                 lease locks, advisory locks held, open election terms
//	pgclaim claims --table T      rows per state of a claimed table, stale rows
//	pgclaim sweep --table T ...   move stale claimed rows to another state
//	pgclaim release --lock NAME   free a lease lock, fenced, after confirmation
//	pgclaim schedules SUB ...     stored schedules: list, pause, resume, trigger, backfill, missed
//	pgclaim schema [--out DIR]    write pgclaim's migrations (for an application's sqlc schema)
//	pgclaim serve [--addr A]      serve the status page (read-only unless given an action token)
//	pgclaim grants --role NAME    print the GRANT statements an application role needs
//	pgclaim doctor [--instances N] check the database and this DSN: version, fence, pooling, grants, connections
//
// The database is named by --database-url or the DATABASE_URL environment
// variable. Output is an aligned table; --json prints JSON for scripts.
// The exit status is 0 on success, 1 on error and 2 on a usage error.
// Run "pgclaim help COMMAND" for a command's flags.
package main
