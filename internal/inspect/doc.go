// Package inspect holds the read-only queries that show what pgclaim holds
// in a database — lease and advisory locks, open election terms, rows of a
// claimed table per state — shared by the pgclaim CLI and package status.
// Every age and expiry is computed by the database's clock.
package inspect
