package schedule

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// CatchUp says what happens to the instants that came due while no
// instance ran the schedule or while it was paused.
type CatchUp string

// Catch-up policies.
const (
	// CatchUpNone records each such instant skipped, with its reason.
	CatchUpNone CatchUp = "none"
	// CatchUpLatest runs the newest of them (if inside CatchUpWindow) and
	// records the others skipped. The default.
	CatchUpLatest CatchUp = "latest"
	// CatchUpAll runs each of them inside CatchUpWindow, oldest first, once:
	// at most CatchUpCap (the newest ones); the others are recorded skipped.
	CatchUpAll CatchUp = "all"
)

// Overlap says what happens to an instant that comes due while the
// schedule's previous run is still running (or waiting for its retry).
type Overlap string

// Overlap policies.
const (
	// OverlapSkip records the instant skipped, naming the run still
	// running. The default.
	OverlapSkip Overlap = "skip"
	// OverlapBufferOne keeps one such instant, which runs when the current
	// run ends; further ones are recorded skipped.
	OverlapBufferOne Overlap = "buffer_one"
	// OverlapBufferAll keeps every such instant: each runs, oldest first,
	// once the runs before it have ended, and none is skipped for overlap.
	// Pick it when every instant must complete; runs that take longer than
	// the period then build a backlog (visible as late runs).
	OverlapBufferAll Overlap = "buffer_all"
	// OverlapReplace cancels the previous run when the instant is recorded:
	// it is recorded skipped, naming the instant that replaced it; its
	// running attempt's context is cancelled (the cause wraps ErrLost) and
	// its fence goes stale, so its completion, if it comes, changes
	// nothing. The new instant runs. Of several instants recorded at once
	// while a run runs, the newest runs and the others are skipped.
	OverlapReplace Overlap = "replace"
)

// RetryPolicy says how often an instant is attempted. An attempt that
// returned an error (or panicked) is retried after Backoff, doubling per
// attempt up to MaxBackoff (0: Backoff each time), until MaxAttempts
// attempts have been made; then the instant is recorded failed with the
// last error. An attempt whose holder died (its session or lease gone)
// counts as an attempt too. The zero RetryPolicy means 3 attempts, 1 s
// back-off doubling up to 1 min; MaxAttempts 0 alone means 3.
type RetryPolicy struct {
	MaxAttempts int
	Backoff     time.Duration
	MaxBackoff  time.Duration
}

// delay is the wait after the failure of attempt n (1 for the first).
func (r RetryPolicy) delay(n int) time.Duration {
	d := r.Backoff
	if r.MaxBackoff <= 0 {
		return d
	}
	for i := 1; i < n && d < r.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.MaxBackoff)
}

// Definition is a schedule as code declares it. Scheduler.Register stores
// it; every instance then runs the stored definition, which only a strictly
// higher Version replaces (see the package doc, "Registration").
type Definition struct {
	// Name identifies the schedule. Required.
	Name string
	// Spec is a cron spec: five fields (minute hour day-of-month month
	// day-of-week), or six with seconds first, or a descriptor such as
	// "@daily" or "@hourly". Required. "@every" is refused (instants are
	// wall-clock times): write "*/10 * * * * *" for every 10 seconds. A
	// spec with no instant in the next 5 years ("0 9 31 2 *") is refused.
	Spec string
	// TimeZone is the IANA zone Spec is read in ("Europe/Berlin"). Default
	// "UTC". Instants are stored in UTC.
	TimeZone string
	// Version orders definitions of the same schedule across deployments:
	// at least 1. Raise it with every change to the definition.
	Version int
	// CatchUp is the catch-up policy (default CatchUpLatest).
	CatchUp CatchUp
	// CatchUpWindow bounds how old an instant may be and still run by
	// catch-up (CatchUpLatest and CatchUpAll); 0: no bound.
	CatchUpWindow time.Duration
	// CatchUpCap is the most instants CatchUpAll runs after a gap
	// (default 10).
	CatchUpCap int
	// Overlap is the overlap policy (default OverlapSkip).
	Overlap Overlap
	// Retry is the retry policy.
	Retry RetryPolicy
	// ExpectedDuration is how long an attempt is expected to take (0: not
	// stated). An attempt still running after it (database time) is
	// overdue: EventOverdue, a warning, and the run's row marked overdue,
	// once per attempt. The attempt goes on running.
	ExpectedDuration time.Duration
	// LateAfter is how long after its instant a run's first attempt may
	// start and still be on time; one starting later is late: EventLate, a
	// warning, and the run's row marked late (backfilled runs never are).
	// Default 10 s.
	LateAfter time.Duration
	// Jitter delays the start of each scheduled instant by an amount from
	// 0 up to Jitter, fixed per instant (a hash of the schedule's name and
	// the instant), to spread the load of many schedules due at once. The
	// instant itself (Run.Instant, the ledger's key) stays the scheduled
	// one, and lateness is measured from the delayed start. Triggered and
	// backfilled runs are not delayed. Default 0: none.
	Jitter time.Duration
	// Retention is how long this schedule's finished runs are kept:
	// Config.Retention for this schedule (see there). It is this
	// instance's setting, not stored with the definition (give every
	// instance the same). Default (0): Config.Retention; KeepRuns keeps
	// every run; otherwise at least an hour and longer than CatchUpWindow.
	Retention time.Duration
	// Lease is how long an attempt stays exclusive without a renewal: the
	// running attempt renews it every Lease/3; with Config.LeaseLocks, a
	// run whose holder stopped renewing is taken over once it expires.
	// Default 30 s; at least 500 ms.
	Lease time.Duration
}

const (
	defaultCatchUpCap = 10
	defaultLease      = 30 * time.Second
	defaultLateAfter  = 10 * time.Second
	minLease          = 500 * time.Millisecond
	defaultAttempts   = 3
)

// MaxNameLen is the longest schedule name, in bytes.
const MaxNameLen = 200

// checkName enforces the character set of schedule names: 1 to MaxNameLen
// bytes of UTF-8 of printable characters — letters, marks, digits,
// punctuation, symbols and the ASCII space, not at either end. Control
// characters (terminal escapes, tabs, newlines), format characters
// (bidirectional overrides) and other spaces are refused: a name is
// printed by the CLI and logged as it is.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("is %d bytes long, more than %d", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%q is not valid UTF-8", name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%q starts or ends with a space", name)
	}
	for i, r := range name {
		if !unicode.IsGraphic(r) || (r != ' ' && unicode.IsSpace(r)) {
			return fmt.Errorf("%q has the character %U at byte %d: names are printable characters (letters, digits, punctuation, symbols, the ASCII space)", name, r, i)
		}
	}
	return nil
}

// normalize validates d and fills its defaults, returning the parsed spec.
// Errors name the field and wrap ErrInvalid.
func (d Definition) normalize() (Definition, *cronSpec, error) {
	f := func(name, msg string) error { return invalid("Definition."+name, msg) }
	if err := checkName(d.Name); err != nil {
		return d, nil, f("Name", err.Error())
	}
	if err := checkRetention("Definition.Retention", d.Retention, d.CatchUpWindow); err != nil {
		return d, nil, err
	}
	switch {
	case d.Spec == "":
		return d, nil, f("Spec", "must not be empty")
	case d.Version < 1:
		return d, nil, f("Version", fmt.Sprintf("must be at least 1, got %d", d.Version))
	case d.CatchUpWindow < 0:
		return d, nil, f("CatchUpWindow", "must not be negative")
	case d.CatchUpCap < 0:
		return d, nil, f("CatchUpCap", "must not be negative")
	case d.Retry.MaxAttempts < 0:
		return d, nil, f("Retry.MaxAttempts", "must not be negative")
	case d.Retry.Backoff < 0:
		return d, nil, f("Retry.Backoff", "must not be negative")
	case d.Retry.MaxBackoff < 0:
		return d, nil, f("Retry.MaxBackoff", "must not be negative")
	case d.Retry.MaxBackoff > 0 && d.Retry.MaxBackoff < d.Retry.Backoff:
		return d, nil, f("Retry.MaxBackoff", "must not be below Retry.Backoff")
	case d.ExpectedDuration < 0:
		return d, nil, f("ExpectedDuration", "must not be negative")
	case d.LateAfter < 0:
		return d, nil, f("LateAfter", "must not be negative")
	case d.Jitter < 0:
		return d, nil, f("Jitter", "must not be negative")
	case d.Lease < 0:
		return d, nil, f("Lease", "must not be negative")
	case d.Lease > 0 && d.Lease < minLease:
		return d, nil, f("Lease", "must be at least "+minLease.String())
	}
	switch d.CatchUp {
	case "":
		d.CatchUp = CatchUpLatest
	case CatchUpNone, CatchUpLatest, CatchUpAll:
	default:
		return d, nil, f("CatchUp", fmt.Sprintf("%q is not none, latest or all", string(d.CatchUp)))
	}
	switch d.Overlap {
	case "":
		d.Overlap = OverlapSkip
	case OverlapSkip, OverlapBufferOne, OverlapBufferAll, OverlapReplace:
	default:
		return d, nil, f("Overlap", fmt.Sprintf("%q is not skip, buffer_one, buffer_all or replace", string(d.Overlap)))
	}
	if d.TimeZone == "" {
		d.TimeZone = "UTC"
	}
	if _, err := time.LoadLocation(d.TimeZone); err != nil || d.TimeZone == "Local" {
		return d, nil, f("TimeZone", fmt.Sprintf("%q is not a known IANA time zone", d.TimeZone))
	}
	spec, err := parseSpec(d.Spec, d.TimeZone)
	if err != nil {
		// parseSpec's message names the spec already: state the field once.
		var fe *fieldError
		if errors.As(err, &fe) && fe.field == "Spec" {
			return d, nil, f("Spec", fe.msg)
		}
		return d, nil, f("Spec", fmt.Sprintf("%q: %s", d.Spec, strings.TrimPrefix(err.Error(), "schedule: ")))
	}
	if spec.never {
		return d, nil, f("Spec", fmt.Sprintf("%q has no instant in the next 5 years: no date has its day of month in its month(s)", d.Spec))
	}
	if d.CatchUpCap == 0 {
		d.CatchUpCap = defaultCatchUpCap
	}
	if d.Retry == (RetryPolicy{}) {
		d.Retry = RetryPolicy{MaxAttempts: defaultAttempts, Backoff: time.Second, MaxBackoff: time.Minute}
	} else if d.Retry.MaxAttempts == 0 {
		d.Retry.MaxAttempts = defaultAttempts
	}
	if d.Lease == 0 {
		d.Lease = defaultLease
	}
	if d.LateAfter == 0 {
		d.LateAfter = defaultLateAfter
	}
	return d, spec, nil
}

// jitterDelay is how long the start of the scheduled instant t is
// delayed: from 0 up to d.Jitter (microseconds), fixed per name and
// instant.
func (d Definition) jitterDelay(t time.Time) time.Duration {
	if d.Jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(d.Name))
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(t.UnixMicro())))
	return time.Duration(h.Sum64()%uint64(d.Jitter.Microseconds()+1)) * time.Microsecond
}

// stored is a schedule's row as read back: its definition and state.
type stored struct {
	def         Definition
	spec        *cronSpec
	paused      bool
	pausedAt    time.Time
	resumedAt   time.Time
	startsAt    time.Time
	prunedUntil time.Time     // instants up to it may have been pruned (zero: none)
	retention   time.Duration // as a scheduler last reported it (0: none did; KeepRuns)
	cursor      time.Time     // the newest scheduled instant recorded (zero: none)
	dbNow       time.Time
	pausedNote  string
	pausedBy    string
}

func us(d time.Duration) int64          { return d.Microseconds() }
func dur(us int64) time.Duration        { return time.Duration(us) * time.Microsecond }
func ts(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

func tm(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// loadSchedule reads the stored definition of name; ErrNotFound if none.
func loadSchedule(ctx context.Context, q *store.Queries, name string) (*stored, error) {
	rows, err := q.SchedulesByName(ctx, []string{name})
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: read definition: %w", name, schemaHint(err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return storedOf(rows[0])
}

// storedOf converts a stored definition as read.
func storedOf(r store.SchedulesByNameRow) (*stored, error) {
	d := Definition{
		Name: r.Name, Spec: r.Spec, TimeZone: r.TimeZone, Version: int(r.Version),
		CatchUp: CatchUp(r.CatchUp), CatchUpWindow: dur(r.CatchUpWindowUs), CatchUpCap: int(r.CatchUpCap),
		Overlap:          Overlap(r.Overlap),
		Retry:            RetryPolicy{MaxAttempts: int(r.MaxAttempts), Backoff: dur(r.BackoffUs), MaxBackoff: dur(r.MaxBackoffUs)},
		ExpectedDuration: dur(r.ExpectedUs), LateAfter: dur(r.LateAfterUs), Jitter: dur(r.JitterUs), Lease: dur(r.LeaseUs),
	}
	spec, err := parseSpec(d.Spec, d.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: the stored definition (version %d) does not parse here: %w", r.Name, d.Version, err)
	}
	return &stored{
		def: d, spec: spec, paused: r.Paused, pausedAt: tm(r.PausedAt), resumedAt: tm(r.ResumedAt),
		startsAt: tm(r.StartsAt), prunedUntil: tm(r.PrunedUntil), retention: reportedRetention(r.RetentionUs),
		cursor: tm(r.Cursor), dbNow: tm(r.DbNow), pausedNote: deref(r.PausedNote), pausedBy: deref(r.PausedBy),
	}, nil
}

// differences names the fields in which a and b (normalized) differ, with
// both values: `Spec ("0 9 * * *" here, "0 10 * * *" stored)`.
func differences(here, stored Definition) []string {
	var out []string
	add := func(field string, h, s any) {
		if h != s {
			out = append(out, fmt.Sprintf("%s (%#v here, %#v stored)", field, h, s))
		}
	}
	add("Spec", here.Spec, stored.Spec)
	add("TimeZone", here.TimeZone, stored.TimeZone)
	add("CatchUp", string(here.CatchUp), string(stored.CatchUp))
	add("CatchUpWindow", here.CatchUpWindow.String(), stored.CatchUpWindow.String())
	add("CatchUpCap", here.CatchUpCap, stored.CatchUpCap)
	add("Overlap", string(here.Overlap), string(stored.Overlap))
	add("Retry.MaxAttempts", here.Retry.MaxAttempts, stored.Retry.MaxAttempts)
	add("Retry.Backoff", here.Retry.Backoff.String(), stored.Retry.Backoff.String())
	add("Retry.MaxBackoff", here.Retry.MaxBackoff.String(), stored.Retry.MaxBackoff.String())
	add("ExpectedDuration", here.ExpectedDuration.String(), stored.ExpectedDuration.String())
	add("LateAfter", here.LateAfter.String(), stored.LateAfter.String())
	add("Jitter", here.Jitter.String(), stored.Jitter.String())
	add("Lease", here.Lease.String(), stored.Lease.String())
	return out
}

// followReason says why Register follows the stored definition st rather
// than d, and what to do about it.
func followReason(d, st Definition) string {
	diff := strings.Join(differences(d, st), ", ")
	if diff == "" {
		diff = "no setting"
	}
	switch {
	case d.Version == st.Version:
		return fmt.Sprintf("this instance's definition differs from the stored one in %s, at the same version %d: the stored one is kept and followed; "+
			"raise Definition.Version (to %d) to replace it", diff, d.Version, d.Version+1)
	case d.Version < st.Version:
		return fmt.Sprintf("the stored definition is version %d, newer than this instance's version %d (blue/green: the newer deployment's wins), and differs in %s: "+
			"this instance follows the stored one until it registers version %d or higher", st.Version, d.Version, diff, st.Version+1)
	}
	return fmt.Sprintf("this instance's definition (version %d) differs from the stored one (version %d) in %s, which it follows", d.Version, st.Version, diff)
}

// schemaHint adds to err, when it says one of pgclaim's tables does not
// exist (SQLSTATE 42P01), what to do: migrate first.
func schemaHint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" && strings.Contains(pe.Message, "pgclaim_") {
		return fmt.Errorf("%w: pgclaim's tables are not in this database (or not on its search_path): run 'pgclaim migrate up' or call pgclaim.Migrate first", err)
	}
	if pgerr.ReadOnly(err) {
		return fmt.Errorf("%w: %s", err, pgerr.ReadOnlyServer)
	}
	return err
}

// register stores d (normalized) by the version rule and returns whether
// it was inserted or replaced the stored one.
func register(ctx context.Context, q *store.Queries, d Definition) (changed bool, err error) {
	_, err = q.RegisterSchedule(ctx, store.RegisterScheduleParams{
		Name: d.Name, Spec: d.Spec, TimeZone: d.TimeZone, Version: int32(d.Version),
		CatchUp: string(d.CatchUp), CatchUpWindowUs: us(d.CatchUpWindow), CatchUpCap: int32(d.CatchUpCap),
		Overlap: string(d.Overlap), MaxAttempts: int32(d.Retry.MaxAttempts),
		BackoffUs: us(d.Retry.Backoff), MaxBackoffUs: us(d.Retry.MaxBackoff),
		ExpectedUs: us(d.ExpectedDuration), LateAfterUs: us(d.LateAfter), JitterUs: us(d.Jitter), LeaseUs: us(d.Lease),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("schedule: %q: register: %w", d.Name, schemaHint(err))
	}
	return true, nil
}
