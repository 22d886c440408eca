package status

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status/inspect"
)

// ErrInvalid is wrapped by the errors of New for a bad Config.
var ErrInvalid = errors.New("status: invalid config")

// Config configures the status page. Only Pool is required.
type Config struct {
	// Pool is the database pgclaim's tables are in (migrated). The page
	// holds none of its connections between requests.
	Pool *pgxpool.Pool
	// Tables are the claimed tables the claims view shows, as
	// "pgclaim claims --table" reads them. Empty: the view lists none.
	Tables []Table
	// Grace is the grace the service's schedulers use (their
	// schedule.Config.Grace): an instant due longer ago without a run is
	// missed. Zero: 30s, schedule's default.
	Grace time.Duration
	// Refresh is how often the page reloads itself. Zero: 5s; negative:
	// never.
	Refresh time.Duration
	// Runs is how many of each schedule's newest runs the timeline shows.
	// Zero: 20.
	Runs int
	// Names are further job or election names whose advisory locks the
	// locks view resolves (as "pgclaim locks --name").
	Names []string
	// Actions enables pause, resume, trigger, backfill and lease release
	// from the page (see the package doc: put the handler behind your
	// authentication first). False: the handler is read-only and refuses
	// every POST with 403.
	Actions bool
	// Operator names who acted, from the request's authenticated identity
	// (set by your authentication middleware): it is recorded with a pause
	// and a cancelled backfill, and logged with every action. The form
	// cannot name anyone. Nil: "status page".
	Operator func(r *http.Request) string
	// Authenticated says whether a request comes from an authenticated
	// operator (as your authentication middleware decided). Only they see
	// the action forms (when Actions is true), database errors in full,
	// and the backend pids, application names and client addresses of
	// the locks view. Nil: every viewer is anonymous for what they see;
	// actions still follow Actions.
	Authenticated func(r *http.Request) bool
	// LoginPath and LogoutPath, relative to where the handler is mounted,
	// are linked from the page's header: "log in" for an anonymous viewer,
	// a "log out" button (a POST) for an authenticated one. Empty: no link.
	LoginPath, LogoutPath string
	// AnonymousDetails shows anonymous viewers what only authenticated
	// ones see otherwise: database errors in full (a failed connection
	// names the user, database, host and port) and the sessions of the
	// locks view (backend pids, application names, client addresses).
	// False: an anonymous viewer sees that a read failed and its SQLSTATE,
	// and advisory locks without their sessions.
	AnonymousDetails bool
	// Logger receives the errors of failed reads and actions. Nil:
	// slog.Default().
	Logger *slog.Logger
	// QueryTimeout bounds the reads of one view: each of its statements
	// runs under a statement_timeout of QueryTimeout and the whole read
	// under a deadline of twice that. Zero: 5s.
	QueryTimeout time.Duration
	// MaxReads is how many views are read from the database at once;
	// further requests wait up to QueryTimeout for their turn and are then
	// answered 503 (with Retry-After). The page reads on Pool, the
	// application's own pool in an embedded page: this bounds the
	// connections it takes at MaxReads. Zero: 2.
	MaxReads int
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema,
	// as the service's schedule.Config.Schema and gate.Config.Schema):
	// every read and action names it, so nothing depends on search_path,
	// and the locks view resolves that installation's advisory keys.
	// Default: "", the objects found through search_path.
	Schema string
}

// Table is a claimed table the claims view shows.
type Table struct {
	// Table names the table and its columns (claim's rules; Key, ClaimedBy
	// and Attempts are not read). State and ClaimedAt default to "status"
	// and "claimed_at", as in "pgclaim claims".
	claim.Table
	// Processing is the state rows are in while claimed. Empty:
	// "PROCESSING".
	Processing string
	// StaleAfter: a row in Processing claimed longer ago (or, with a
	// LeaseUntil column, past its lease) is stuck. Zero: 24h.
	StaleAfter time.Duration
	// EstimateAbove: a table with at least this many rows by the planner's
	// count (pg_class.reltuples) has its rows per state and its reasons
	// estimated from a sample of its pages, and the page says so; its rows
	// in Processing are always counted. Zero: 200,000; negative: always
	// counted.
	EstimateAbove int64
}

// Handler serves the status page; New builds one.
type Handler struct {
	cfg    Config
	sched  *schedule.Scheduler
	tables []table
	log    *slog.Logger
	cop    *http.CrossOriginProtection
	reads  chan struct{}   // MaxReads slots
	schema *qualify.Schema // Config.Schema
}

type table struct {
	Table
	in inspect.Table
}

//go:embed templates/*.html
var templateFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"time":    fmtTime,
	"timep":   fmtTimePtr,
	"since":   since,
	"seconds": fmtSeconds,
	"dur":     func(s float64) string { return fmtSeconds(&s) },
	"kept":    inspect.RetentionText,
}).ParseFS(templateFS, "templates/*.html"))

// New returns the status page's handler. It validates cfg (the table
// specs by claim's rules) and touches no database.
func New(cfg Config) (*Handler, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: Config.Pool is nil", ErrInvalid)
	}
	if cfg.Grace < 0 || cfg.Runs < 0 || cfg.QueryTimeout < 0 || cfg.MaxReads < 0 {
		return nil, fmt.Errorf("%w: Config.Grace, Config.Runs, Config.QueryTimeout and Config.MaxReads must not be negative", ErrInvalid)
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 5 * time.Second
	}
	if cfg.MaxReads == 0 {
		cfg.MaxReads = 2
	}
	if cfg.Grace == 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.Runs == 0 {
		cfg.Runs = 20
	}
	if cfg.Operator == nil {
		cfg.Operator = func(*http.Request) string { return "status page" }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	sched, err := schedule.New(cfg.Pool, schedule.Config{Holder: "pgclaim-status", Logger: log, Grace: cfg.Grace, Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	h := &Handler{cfg: cfg, sched: sched, log: log, cop: http.NewCrossOriginProtection(), reads: make(chan struct{}, cfg.MaxReads), schema: qualify.New(cfg.Schema)}
	for i, t := range cfg.Tables {
		if t.Processing == "" {
			t.Processing = "PROCESSING"
		}
		if t.StaleAfter < 0 {
			return nil, fmt.Errorf("%w: Config.Tables[%d].StaleAfter must not be negative", ErrInvalid, i)
		}
		if t.StaleAfter == 0 {
			t.StaleAfter = 24 * time.Hour
		}
		switch {
		case t.EstimateAbove == 0:
			t.EstimateAbove = defaultEstimateAbove
		case t.EstimateAbove < 0:
			t.EstimateAbove = 0
		}
		spec := t.Table
		if spec.Key == "" {
			spec.Key = "id" // not read
		}
		if spec.State == "" {
			spec.State = "status"
		}
		if spec.ClaimedAt == "" {
			spec.ClaimedAt = "claimed_at"
		}
		// The claimer validates the identifiers; it never claims.
		if _, err := claim.New[any](cfg.Pool, spec, claim.Config{From: t.Processing + " (unused)", To: t.Processing}); err != nil {
			return nil, fmt.Errorf("%w: Config.Tables[%d]: %w", ErrInvalid, i, err)
		}
		t.Table = spec
		h.tables = append(h.tables, table{Table: t, in: inspect.Table{
			QName: pgx.Identifier(strings.Split(spec.Name, ".")).Sanitize(), State: quote(spec.State),
			ClaimedAt: quote(spec.ClaimedAt), LeaseUntil: quote(spec.LeaseUntil), Reason: quote(spec.Reason),
			EstimateAbove: t.EstimateAbove,
		}})
	}
	return h, nil
}

// defaultEstimateAbove is Table.EstimateAbove's default.
const defaultEstimateAbove = 200_000

func quote(c string) string {
	if c == "" {
		return ""
	}
	return pgx.Identifier{c}.Sanitize()
}

// csrfCookie holds the double-submit token.
const csrfCookie = "pgclaim_status_csrf"

// ServeHTTP serves the views (GET, HEAD) and, when enabled, the actions
// (POST).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "same-origin")
	path := strings.TrimPrefix(r.URL.Path, "/")
	if action, ok := strings.CutPrefix(path, "actions/"); ok {
		h.act(w, r, action)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	asJSON := r.URL.Query().Get("format") == "json"
	if p, ok := strings.CutSuffix(path, ".json"); ok {
		path, asJSON = p, true
	}
	if path == "" {
		path = "schedules"
	}
	read, ok := h.views()[path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	select {
	case h.reads <- struct{}{}:
	case <-time.After(h.cfg.QueryTimeout):
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, h.cfg.QueryTimeout/time.Second))))
		http.Error(w, "busy: too many views are being read; try again shortly", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*h.cfg.QueryTimeout)
	detailed := h.cfg.AnonymousDetails || h.authenticated(r)
	data, err := read(r.WithContext(context.WithValue(ctx, detailKey{}, detailed)))
	cancel()
	<-h.reads
	code := http.StatusOK
	if err != nil {
		h.log.ErrorContext(r.Context(), "status: reading the view", "view", path, "err", err)
		code = http.StatusInternalServerError
	}
	if asJSON {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err != nil {
			_ = enc.Encode(map[string]string{"error": errorText(err, detailed)})
			return
		}
		_ = enc.Encode(data)
		return
	}
	authed := h.authenticated(r)
	p := page{View: path, Data: data, Actions: h.cfg.Actions && (h.cfg.Authenticated == nil || authed), Refresh: int(h.cfg.Refresh.Round(time.Second) / time.Second),
		OK: r.URL.Query().Get("ok"), Failed: r.URL.Query().Get("failed"), BackfillLimit: schedule.BackfillLimit,
		Authenticated: authed, LoginPath: h.cfg.LoginPath, LogoutPath: h.cfg.LogoutPath, ActionsConfigured: h.cfg.Actions}
	switch {
	case h.cfg.Refresh < 0 || r.URL.Query().Get("refresh") == "off":
		p.Refresh, p.Paused = 0, h.cfg.Refresh >= 0
	case p.Refresh < 1:
		p.Refresh = 1
	}
	if err != nil {
		p.Error = errorText(err, detailed)
	}
	p.Detailed = detailed
	if p.Actions {
		p.CSRF = h.csrfToken(w, r)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := pages.ExecuteTemplate(w, "page.html", p); err != nil {
		h.log.ErrorContext(r.Context(), "status: rendering the page", "view", path, "err", err)
	}
}

// page is what page.html renders.
type page struct {
	View, Error, OK, Failed, CSRF string
	Actions                       bool
	Refresh                       int  // seconds; 0: none
	Paused                        bool // refresh stopped by ?refresh=off
	Data                          any
	BackfillLimit                 int
	Authenticated                 bool
	ActionsConfigured             bool // Config.Actions
	LoginPath, LogoutPath         string
	Detailed                      bool // sessions and full errors shown
}

// detailKey marks a read's context: may the viewer see sessions and full
// errors?
type detailKey struct{}

func detailed(ctx context.Context) bool { d, _ := ctx.Value(detailKey{}).(bool); return d }

// errorText is err as a viewer may see it: in full when detailed, else
// without what it says of the connection (user, database, host, port),
// which the log has.
func errorText(err error, detailed bool) string {
	if detailed {
		return err.Error()
	}
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		return fmt.Sprintf("the database refused a read: %s (SQLSTATE %s); details in the server's log", pe.Message, pe.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return "the read took too long; details in the server's log"
	}
	return "the read failed (the database may be unreachable); details in the server's log"
}

// authenticated says whether r comes from an authenticated operator.
func (h *Handler) authenticated(r *http.Request) bool {
	return h.cfg.Authenticated != nil && h.cfg.Authenticated(r)
}

// csrfToken returns the request's CSRF token, setting a new one in the
// cookie when it has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validToken(c.Value) {
		return c.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails
	tok := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return tok
}

func validToken(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// checkCSRF refuses a POST whose form does not repeat the cookie's token
// or that the browser marks cross-origin.
func (h *Handler) checkCSRF(r *http.Request) error {
	if err := h.cop.Check(r); err != nil {
		return err
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || !validToken(c.Value) {
		return errors.New("no CSRF cookie: reload the page and try again")
	}
	form := r.PostFormValue("csrf")
	if subtle.ConstantTimeCompare([]byte(form), []byte(c.Value)) != 1 {
		return errors.New("missing or wrong CSRF token: reload the page and try again")
	}
	return nil
}

// back redirects to the view with a message (ok or failed).
func back(w http.ResponseWriter, view, key, msg string) {
	w.Header().Set("Location", "../"+view+"?"+url.Values{key: {msg}}.Encode())
	w.WriteHeader(http.StatusSeeOther)
}
