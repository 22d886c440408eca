// Package roletest is support for pgclaim's tests: it connects to a test
// database as a fresh role that is not a superuser, with only the
// privileges a test grants it, and emulates servers that refuse the WAL
// control functions (as Aurora does) by revoking them from PUBLIC.
package roletest
