// Package pgtest gives tests a real PostgreSQL database with pgclaim's schema
// applied: one server per test process, one fresh database per test, cloned
// from a migrated template in tens of milliseconds.
//
// The server comes from, in order: the connection string in
// PGCLAIM_TEST_DATABASE_URL; a container from testcontainers-go when a Docker
// engine answers and the test binary imports package pgtest/pgcontainer (pgtest
// alone links no container runtime); an ephemeral cluster started from local PostgreSQL binaries
// (as the postgres user when the process runs as root), removed when the test
// process exits. PGCLAIM_TEST_PG_BIN names the directory of the binaries for
// every cluster pgtest starts (the local one, and NewPair's), so that a run
// uses one major version throughout; PostgreSQL 13 to 18 are supported.
// When none is available, tests are skipped with a message naming the three
// options — except when the CI environment variable is "true", where they
// fail.
//
// Applications using pgclaim can call NewDatabaseFrom with a Template whose
// Setup applies their own migrations, so each test starts from their full
// schema.
//
// For fault tests the Server offers Terminate (one backend),
// TerminateDatabase (every backend of a database) and Restart (an immediate
// stop and start of a cluster pgtest started itself). For failover tests,
// NewPair starts a primary with a streaming standby (asynchronous or
// synchronous) from local binaries, which a test can cut off, kill and
// promote.
package pgtest
