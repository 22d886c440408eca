// Package listen is the one connection of a process that listens for
// pgclaim's notifications on a pool: every claim Worker and Scheduler of the
// process on that pool subscribes to it, so that listening costs one
// connection per pool (budget.DedicatedSessions counts it) whatever the number
// of subscribers. It is taken out of the pool (pgxpool.Conn.Hijack) when
// the first subscriber arrives and closed when the last one leaves. It is
// part of the foundation that packages claim, gate and schedule stand on,
// and imports none of them.
//
// Subscribers are told three things: a notification on their channel (a
// wake-up, or a payload), that the connection was (re)established — anything
// may have been announced while it was down, so look once now — and whether
// it is listening at all (behind a transaction-mode pooler it cannot: the
// subscribers poll).
package listen
