// Package lockcore is the lock mechanism pgclaim's protocols are built on
// (gate's Once, Exclusive, Lease and Elector; any package of the module that
// runs work under a lock). It holds no policy of its own about names,
// events or logs: a protocol acquires a lock with its own statement, gets a
// fencing token, starts a Keeper that confirms the lock is still held and
// reports its loss, runs its job with Run, and releases the lock with an
// outcome.
//
// Two kinds of lock live here:
//
//   - an advisory session: a connection taken out of the pool (Session,
//     cached by Sessions) holding a session advisory lock, confirmed by
//     Session.Watch, which blocks reading the socket and pings after quiet;
//   - a lease row: a row with a database-time expiry, confirmed by Renew,
//     which renews it on a cadence through the pool.
//
// Both keep a Validity, the instance-clock bound until which the last
// confirmation holds the lock, and both report loss the same way: the Keeper
// ends and calls its onLost function once. Run is the one path that runs a
// job under a held lock: it merges the caller's context with the lock's,
// times the job, recovers a panic (recorded as abandoned, then re-raised by
// the protocol after reporting), classifies the outcome, and releases with a
// context (ReleaseContext) that outlives the caller's cancellation.
//
// The package imports store, never the protocols; errors that reach users
// (ErrClosed, ErrPooler, a PanicError) are re-exported by gate.
package lockcore
