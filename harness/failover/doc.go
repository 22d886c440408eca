// Package failover holds tests of pgclaim across a primary promotion: a real
// primary with a streaming standby (pgtest.NewPair), asynchronous and
// synchronous, the standby cut off so that it misses the primary's last
// WAL, the primary killed and the standby promoted. They check that no
// fencing token acknowledged before the promotion is granted again after
// it, and that a zombie holding a token of the old primary can finish,
// extend or record nothing on the new one. It is part of pgclaim's harness
// (harness/README.md), not of its API: its names may change in any release.
package failover
