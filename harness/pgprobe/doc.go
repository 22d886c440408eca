// Package pgprobe is support for pgclaim's tests: it looks at the server's
// advisory locks in pg_locks and puts a proxy between a pool and the server
// (one that can pose as a connection pooler or as a network gone quiet).
// It imports no pgclaim package, so the tests of any of them can use it. It
// is part of pgclaim's harness (harness/README.md), not of its API: its
// names may change in any release.
package pgprobe
