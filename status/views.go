package status

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status/inspect"
	"github.com/pgclaim/pgclaim/store"
)

// Schedules is the schedules view (JSON: /schedules.json).
type Schedules struct {
	DBNow     time.Time  `json:"db_now"`
	Schedules []Schedule `json:"schedules"`
}

// Schedule is a schedule's status as "pgclaim schedules list --json"
// shows it (NextDue computed in the database's time), with its newest
// runs.
type Schedule struct {
	inspect.Schedule
	// Timeline is the newest runs (Config.Runs) and the missed instants no
	// instance recorded after the oldest of them, oldest first.
	Timeline []Run `json:"timeline"`
}

// Run is a run of a schedule, or (State "missed", Unrecorded) an instant
// that was due and that no instance recorded.
type Run struct {
	Instant    time.Time  `json:"instant"`
	Kind       string     `json:"kind"`
	State      string     `json:"state"`
	Attempt    int        `json:"attempt"`
	Fence      int64      `json:"fence,omitempty"`
	Holder     string     `json:"holder,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Missed     bool       `json:"missed"`
	Unrecorded bool       `json:"unrecorded,omitempty"`
	Late       bool       `json:"late"`
	Overdue    bool       `json:"overdue"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// Leaders is the leaders view (JSON: /leaders.json): the open term of each
// election (its leader) and the newest terms.
type Leaders struct {
	Open   []inspect.Term     `json:"open"`
	Recent []inspect.PastTerm `json:"recent"`
}

// Claims is the claims view (JSON: /claims.json): one entry per
// Config.Tables, in order.
type Claims struct {
	Tables []ClaimedTable `json:"tables"`
}

// ClaimedTable is a claimed table as "pgclaim claims --reason" reads it,
// or the error reading it.
type ClaimedTable struct {
	inspect.Claims
	Error string `json:"error,omitempty"`
}

func (h *Handler) views() map[string]func(*http.Request) (any, error) {
	return map[string]func(*http.Request) (any, error){
		"schedules": func(r *http.Request) (any, error) { return h.schedules(r.Context()) },
		"leaders": func(r *http.Request) (any, error) {
			var l Leaders
			err := h.readTx(r.Context(), func(db inspect.DB) (err error) { l, err = h.leaders(r.Context(), db); return err })
			return l, err
		},
		"locks": func(r *http.Request) (any, error) {
			var l inspect.Locks
			err := h.readTx(r.Context(), func(db inspect.DB) (err error) {
				l, err = inspect.ReadAllLocks(r.Context(), db, h.cfg.Schema, h.cfg.Names)
				return err
			})
			if !detailed(r.Context()) {
				for i := range l.Advisory {
					a := &l.Advisory[i]
					a.PID, a.ApplicationName, a.ClientAddr, a.BackendStart = nil, nil, nil, nil
				}
			}
			return l, err
		},
		"claims": func(r *http.Request) (any, error) { return h.claims(r.Context()), nil },
	}
}

// readTx runs fn's reads in a read-only transaction whose statements each
// end after Config.QueryTimeout.
func (h *Handler) readTx(ctx context.Context, fn func(inspect.DB) error) error {
	return pgx.BeginTxFunc(ctx, h.cfg.Pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, strconv.FormatInt(h.cfg.QueryTimeout.Milliseconds(), 10)); err != nil {
			return err
		}
		return fn(h.schema.Wrap(tx))
	})
}

// recentTerms is how many terms the leaders view lists.
const recentTerms = 20

func (h *Handler) leaders(ctx context.Context, db inspect.DB) (Leaders, error) {
	l, err := inspect.ReadLocks(ctx, db, h.cfg.Schema, nil)
	if err != nil {
		return Leaders{}, err
	}
	recent, err := inspect.ReadTerms(ctx, db, recentTerms)
	return Leaders{Open: l.Elections, Recent: recent}, err
}

func (h *Handler) claims(ctx context.Context) Claims {
	out := Claims{Tables: []ClaimedTable{}}
	for _, t := range h.tables {
		var c inspect.Claims
		err := h.readTx(ctx, func(db inspect.DB) (err error) {
			c, err = inspect.ReadClaims(ctx, db, t.in, t.Processing, t.StaleAfter)
			return err
		})
		ct := ClaimedTable{Claims: c}
		if err != nil {
			h.log.ErrorContext(ctx, "status: reading a claimed table", "table", t.Name, "err", err)
			ct = ClaimedTable{Claims: inspect.Claims{Table: t.in.QName, Processing: t.Processing}, Error: errorText(err, detailed(ctx))}
		}
		out.Tables = append(out.Tables, ct)
	}
	return out
}

// maxTimelineMissed bounds the unrecorded missed instants a timeline shows.
const maxTimelineMissed = 20

func (h *Handler) schedules(ctx context.Context) (Schedules, error) {
	all, err := h.sched.List(ctx)
	if err != nil {
		return Schedules{}, err
	}
	out := Schedules{Schedules: []Schedule{}}
	for _, st := range all {
		out.DBNow = st.DBNow.UTC()
		s := Schedule{Schedule: inspect.ScheduleOf(st), Timeline: []Run{}}
		runs, err := h.sched.Runs(ctx, st.Name, h.cfg.Runs)
		if err != nil {
			return Schedules{}, err
		}
		var since time.Time
		for _, r := range runs {
			s.Timeline = append(s.Timeline, Run{
				Instant: r.Instant.UTC(), Kind: r.Kind, State: r.State, Attempt: r.Attempt, Fence: r.Fence, Holder: r.Holder,
				Reason: r.Reason, Missed: r.Missed, Late: r.Late, Overdue: r.Overdue,
				StartedAt: timePtr(r.StartedAt), FinishedAt: timePtr(r.FinishedAt),
			})
			since = r.Instant
		}
		if st.MissedUnrecorded > 0 {
			missed, _, err := h.sched.Missed(ctx, st.Name, since, maxTimelineMissed)
			if err != nil {
				return Schedules{}, err
			}
			for _, t := range missed {
				s.Timeline = append(s.Timeline, Run{Instant: t.UTC(), Kind: "scheduled", State: "missed", Missed: true, Unrecorded: true})
			}
		}
		slices.SortStableFunc(s.Timeline, func(a, b Run) int { return a.Instant.Compare(b.Instant) })
		out.Schedules = append(out.Schedules, s)
	}
	if len(all) == 0 {
		if err := h.cfg.Pool.QueryRow(ctx, `SELECT now()`).Scan(&out.DBNow); err != nil {
			return Schedules{}, err
		}
		out.DBNow = out.DBNow.UTC()
	}
	return out, nil
}

// act runs a POSTed action.
func (h *Handler) act(w http.ResponseWriter, r *http.Request, action string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed: actions are POSTs", http.StatusMethodNotAllowed)
		return
	}
	if !h.cfg.Actions {
		http.Error(w, "actions are disabled: this status page is read-only", http.StatusForbidden)
		return
	}
	if h.cfg.Authenticated != nil && !h.authenticated(r) {
		http.Error(w, "refused: log in first", http.StatusUnauthorized)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := h.checkCSRF(r); err != nil {
		http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
		return
	}
	ctx := r.Context()
	name := strings.TrimSpace(r.PostFormValue("name"))
	var msg string
	var err error
	view := "schedules"
	switch action {
	case "pause":
		note := strings.TrimSpace(r.PostFormValue("note"))
		if note == "" {
			err = fmt.Errorf("a note saying why is required to pause %q", name)
			break
		}
		if err = h.sched.Pause(ctx, name, note, h.cfg.Operator(r)); err == nil {
			msg = fmt.Sprintf("paused %s", name)
		}
	case "resume":
		if err = h.sched.Resume(ctx, name); err == nil {
			msg = fmt.Sprintf("resumed %s", name)
		}
	case "trigger":
		var at time.Time
		var created bool
		if at, created, err = h.sched.Trigger(ctx, name); err == nil {
			msg = fmt.Sprintf("triggered %s: run %s created", name, fmtTime(at))
			if !created {
				msg = fmt.Sprintf("a triggered run of %s is already open (%s): none added", name, fmtTime(at))
			}
		}
	case "backfill":
		msg, err = h.backfill(r, name)
	case "cancel-backfill":
		var res schedule.CancelBackfillResult
		if res, err = h.sched.CancelBackfill(ctx, name, h.cfg.Operator(r)); err == nil {
			msg = fmt.Sprintf("cancelled %d backfilled runs of %s that had not started", res.Cancelled, name)
			if res.Cancelled > 0 {
				msg += fmt.Sprintf(" (%s to %s): recorded skipped", fmtTime(res.First), fmtTime(res.Last))
			}
		}
	case "release":
		view = "locks"
		msg, err = h.release(r, name)
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		h.log.WarnContext(ctx, "status: action failed", "action", action, "name", name, "err", err)
		back(w, view, "failed", err.Error())
		return
	}
	h.log.InfoContext(ctx, "status: action", "action", action, "name", name, "by", h.cfg.Operator(r), "result", msg)
	back(w, view, "ok", msg)
}

func (h *Handler) backfill(r *http.Request, name string) (string, error) {
	from, err := parseFormTime("from", r.PostFormValue("from"))
	if err != nil {
		return "", err
	}
	to, err := parseFormTime("to", r.PostFormValue("to"))
	if err != nil {
		return "", err
	}
	maxN := 100
	if s := strings.TrimSpace(r.PostFormValue("max")); s != "" {
		if maxN, err = strconv.Atoi(s); err != nil || maxN < 1 {
			return "", fmt.Errorf("max: %q is not a positive number", s)
		}
		if maxN > schedule.BackfillLimit {
			return "", fmt.Errorf("max: %d is above the limit of %d: backfill in steps, or from the CLI with 'pgclaim schedules backfill --above-limit'", maxN, schedule.BackfillLimit)
		}
	}
	dry := r.PostFormValue("record") != "yes"
	res, err := h.sched.Backfill(r.Context(), name, schedule.BackfillOptions{From: from, To: to, Max: maxN, DryRun: dry})
	if err != nil {
		return "", err
	}
	verb := "recorded"
	if dry {
		verb = "dry run: would record"
	}
	msg := fmt.Sprintf("backfill of %s in (%s, %s]: %s %d instants; %d already in the ledger", name, fmtTime(from), fmtTime(res.Until), verb, len(res.Instants), res.Present)
	if res.LeftOut > 0 {
		msg += fmt.Sprintf("; %d more beyond max", res.LeftOut)
	}
	if res.Clamped {
		msg += fmt.Sprintf("; %d instants after the scheduler's frontier (%s) are left to it", res.Cut, fmtTime(res.Until))
	}
	return msg, nil
}

// release frees a lease lock only while it carries the fencing token the
// page showed: the statement "pgclaim release" runs.
func (h *Handler) release(r *http.Request, name string) (string, error) {
	fence, err := strconv.ParseInt(r.PostFormValue("fence"), 10, 64)
	if err != nil || fence < 1 {
		return "", fmt.Errorf("fence: %q is not a fencing token", r.PostFormValue("fence"))
	}
	if name == "" {
		return "", fmt.Errorf("name: the lease's name is required")
	}
	n, err := store.New(h.schema.Wrap(h.cfg.Pool)).ReleaseLease(r.Context(), store.ReleaseLeaseParams{Name: name, Fence: fence, AtLeastUs: 0})
	if err != nil {
		return "", fmt.Errorf("releasing lease %q: %w", name, err)
	}
	if n != 1 {
		return "", fmt.Errorf("lease %q not released: it no longer carries fence %d or has expired", name, fence)
	}
	return fmt.Sprintf("released lease %s (fence %d)", name, fence), nil
}

// parseFormTime reads an <input type=datetime-local> value (UTC) or an RFC
// 3339 time.
func parseFormTime(field, s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: %q is not a time: want UTC 2026-03-01T09:00 or RFC 3339", field, s)
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return fmtTime(*t)
}

// since is how long before now t was ("in 5s" when after).
func since(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	d := now.Sub(*t).Round(time.Second)
	if d == 0 {
		return "now"
	}
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func fmtSeconds(s *float64) string {
	if s == nil {
		return "-"
	}
	return (time.Duration(*s * float64(time.Second))).Round(time.Second).String()
}
