package main

import (
	"context"
	"fmt"
	"time"
)

const ticksAbout = `
Lists the most recent ticks recorded in the tick ledger (pgclaim_ticks), newest
first for each job: the scheduled instant, the instance that ran it, its fencing
token, when it started, how long it ran (so far, while running), how it ended
and its error. Times are UTC; durations are measured by the database's clock.`

type tickJSON struct {
	Job             string     `json:"job"`
	FireAt          time.Time  `json:"fire_at"`
	Holder          string     `json:"holder"`
	Fence           int64      `json:"fence"`
	StartedAt       time.Time  `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	DurationSeconds float64    `json:"duration_seconds"`
	Outcome         string     `json:"outcome"`
	Error           *string    `json:"error"`
}

func runTicks(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "ticks", "ticks [--job NAME] [--limit N] [--database-url URL] [--json]", ticksAbout)
	job := f.String("job", "", "show only the job called `NAME`")
	limit := f.Int("limit", 10, "show the newest `N` ticks of each job")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit must be at least 1, got %d", *limit)
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, "pgclaim_ticks"); err != nil {
		return err
	}

	var jobArg *string
	if *job != "" {
		jobArg = job
	}
	// The primary key (job, fire_at) serves the per-job newest-first scan.
	rows, err := pool.Query(ctx, `
SELECT t.job, t.fire_at, t.holder, t.fence, t.started_at, t.finished_at,
       extract(epoch FROM coalesce(t.finished_at, now()) - t.started_at)::float8,
       t.outcome, t.error
FROM (SELECT DISTINCT job FROM pgclaim_ticks WHERE $1::text IS NULL OR job = $1) j
CROSS JOIN LATERAL (
    SELECT * FROM pgclaim_ticks t
    WHERE t.job = j.job
    ORDER BY t.fire_at DESC
    LIMIT $2
) t
ORDER BY t.job, t.fire_at DESC`, jobArg, *limit)
	if err != nil {
		return dbFail("reading the tick ledger", err)
	}
	defer rows.Close()
	ticks := []tickJSON{}
	for rows.Next() {
		var t tickJSON
		if err := rows.Scan(&t.Job, &t.FireAt, &t.Holder, &t.Fence, &t.StartedAt, &t.FinishedAt,
			&t.DurationSeconds, &t.Outcome, &t.Error); err != nil {
			return dbFail("reading the tick ledger", err)
		}
		ticks = append(ticks, t)
	}
	if err := rows.Err(); err != nil {
		return dbFail("reading the tick ledger", err)
	}

	if f.json {
		return writeJSON(e.stdout, ticks)
	}
	if len(ticks) == 0 {
		if *job != "" {
			fmt.Fprintf(e.stdout, "no ticks recorded for job %q\n", *job)
		} else {
			fmt.Fprintln(e.stdout, "no ticks recorded")
		}
		return nil
	}
	tb := newTable(e.stdout, "JOB", "FIRE AT", "HOLDER", "FENCE", "STARTED", "DURATION", "OUTCOME", "ERROR")
	for _, t := range ticks {
		errText := "-"
		if t.Error != nil {
			errText = truncate(*t.Error, 60)
		}
		tb.row(t.Job, fmtTime(t.FireAt), t.Holder, t.Fence, fmtTime(t.StartedAt),
			fmtDur(time.Duration(t.DurationSeconds*float64(time.Second))), t.Outcome, errText)
	}
	return tb.flush()
}
