// Package standbytest is support for pgclaim's tests against a read-only
// server: a primary and a streaming hot standby (pgtest.Pair) with a
// database "app" on which pgclaim's migrations are applied. It is part of
// pgclaim's harness (harness/README.md), not of its API: its names may
// change in any release.
package standbytest
