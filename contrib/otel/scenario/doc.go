// Package scenario drives pgclaim against a real PostgreSQL database
// (package pgtest) through two Observers, standing for two instances of a
// service, and checks the series they export: claims, lost and swept rows,
// gate ticks and skips, a missed schedule instant, schedule attempts and
// wake-up lag, rows per state, and the leader gauge flipping on failover.
// The tests of this module (through a sdk/metric ManualReader) and of
// github.com/pgclaim/pgclaim/contrib/prometheus (through a scrape of its
// HTTP endpoint) both run it. It is test support, not for production use.
package scenario
