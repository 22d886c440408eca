// Package gocron plugs pgclaim gates into go-co-op/gocron v2, so that a job
// scheduled on every instance of a service takes effect once. Import it
// under another name next to gocron itself:
//
//	import (
//		"github.com/go-co-op/gocron/v2"
//		pggocron "github.com/pgclaim/pgclaim/cronx/gocron"
//	)
//
// It offers three ways, from the strongest guarantee to the loosest:
//
//   - NewTask wraps a job so it runs through the tick ledger
//     (gate.Gate.Once): once per scheduled instant across all instances,
//     whatever their clock offsets, with the job's advisory lock held while
//     it runs. Use it for gocron.CronJob jobs, with the schedule from
//     CronSchedule. NewJob builds the same job as a Job, whose Task goes
//     to gocron and whose RunAt fires it for a chosen instant (in a test).
//   - Locker is a gocron.Locker holding a lease lock (gate.Lease) per job
//     name while the job runs, and for at least LeaseConfig.AtLeast after
//     it was taken. That is lease semantics, not tick semantics: see Locker.
//   - Elector is a gocron.Elector backed by gate.Elector: only the leader
//     runs jobs.
//
// gocron hands a Locker only the job's name, never the instant it fired
// for, so a Locker cannot key the ledger by tick; NewTask can, because it
// wraps the job itself and reads the instant from the schedule.
package gocron
