// Package child starts a program, usually this same executable re-run in
// another role, as a child process that the parent talks to through its
// standard input and output. It is the one way the benchmarks, the chaos
// harness and the push-resume demo start their processes. It is part of
// pgclaim's harness (harness/README.md), not of its API: its names may
// change in any release.
package child
