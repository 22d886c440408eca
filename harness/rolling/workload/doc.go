// Command workload is one instance of a service using pgclaim, for the
// rolling-upgrade test (harness/rolling): it migrates, runs a schedule due
// every second and claims rows of a table, recording each effect with its
// holder and fence, until its standard input closes. The test builds it from
// the current tree and, unchanged, from the previous release's, so it uses
// only API both have. It is part of pgclaim's harness (harness/README.md),
// not of its API.
//
// Usage: DATABASE_URL=… workload HOLDER
package main
