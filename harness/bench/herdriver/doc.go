// Command herdriver is River's side of `pgclaim bench`'s herd scenario: N
// River clients, each with its own pool, all registering the same M
// periodic jobs due at the same instants (the next multiple of the period),
// each job inserting one row through the pool and sleeping. The bench starts
// it as a child process, reads its JSON lines on stdout and measures the
// rest (rows, start lag, backends, transactions) in the database. It is
// part of pgclaim's harness (harness/README.md), not of its API.
//
// It is a module of its own so that pgclaim's module never requires River.
//
// With -mode latency it is River's side of the latency scenario instead
// (latency.go).
//
// Protocol: one JSON object per line on stdout: {"event":"ready"} once every
// client has started, then {"event":"done",...} after stdin closes (or says
// "stop") and the clients have stopped. Errors: {"event":"error","error":…}
// and a non-zero exit.
package main
