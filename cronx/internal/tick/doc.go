// Package tick derives the scheduled instant a cron library fired a job for,
// the way every instance computes it alike. It is shared by the cronx
// adapters.
package tick
