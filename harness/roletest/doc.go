// Package roletest is support for pgclaim's tests: it connects to a test
// database as a fresh role that is not a superuser, with only the
// privileges a test grants it, and emulates servers that refuse the WAL
// control functions (as Aurora does) by revoking them from PUBLIC. It is
// part of pgclaim's harness (harness/README.md), not of its API: its names
// may change in any release.
package roletest
