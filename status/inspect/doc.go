// Package inspect holds the read-only queries that show what pgclaim holds
// in a database — lease and advisory locks, open election terms, rows of a
// claimed table per state. It is the read side shared by package status and
// the pgclaim command. Every age and expiry is computed by the database's
// clock.
//
// It is not part of pgclaim's API, and its names may change in any release:
// read what pgclaim holds through package status or the pgclaim command.
package inspect
