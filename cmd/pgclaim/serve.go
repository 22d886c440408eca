package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/status"
)

func init() {
	register(command{name: "serve", summary: "serve the status page (read-only unless given an action token)", run: runServe})
}

// envActionToken is read when --action-token is not given.
const envActionToken = "PGCLAIM_ACTION_TOKEN"

// defaultServeAddr is loopback: the page is reachable from this host only.
const defaultServeAddr = "127.0.0.1:7373"

const serveAbout = `
Serves the status page of package status over HTTP: schedules (next due,
the latest runs as a timeline, missed, late and overdue instants, pauses),
leaders and their terms, locks and their holders, and the claimed tables
named by --table. Every view is also JSON (append .json to its path). The
page refreshes itself.

It binds ` + defaultServeAddr + ` (loopback) unless --addr says otherwise. It is
read-only unless an action token is given with --action-token or the
` + envActionToken + ` environment variable: then pause, resume, trigger,
backfill and lease release are enabled for whoever logs in at /login with
that token (a cookie), and every action also carries a CSRF token.

--table takes NAME, or NAME:OPTION=VALUE,... with the options state,
claimed_at, lease_until, reason (its columns, as 'pgclaim claims' takes
them), processing (the state of claimed rows) and stale_after (a duration),
for example --table 'push_requests:reason=fail_reason,lease_until=lease_until'.`

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "serve [--addr HOST:PORT] [--table SPEC]... [--action-token TOKEN] [--database-url URL]", serveAbout)
	addr := f.String("addr", defaultServeAddr, "listen on `HOST:PORT`")
	var tables, names stringList
	f.Var(&tables, "table", "show the claimed table `SPEC` (repeatable; see above)")
	f.Var(&names, "name", "also resolve the advisory locks of the job or election called `NAME` (repeatable)")
	token := f.String("action-token", "", "enable actions for those who log in with `TOKEN` (default: $"+envActionToken+")")
	grace := graceFlag(f)
	refresh := f.Duration("refresh", 5*time.Second, "the page reloads itself every `DURATION`")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if err := checkGrace(*grace); err != nil {
		return err
	}
	if *refresh <= 0 {
		return usagef("--refresh must be positive, got %v", *refresh)
	}
	if *token == "" {
		*token = e.getenv(envActionToken)
	}
	if *token != "" && len(*token) < 16 {
		return usagef("the action token must be at least 16 characters long")
	}
	specs := make([]status.Table, 0, len(tables))
	for _, t := range tables {
		s, err := parseTableSpec(t)
		if err != nil {
			return err
		}
		specs = append(specs, s)
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return usagef("--addr: %v", err)
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, "pgclaim_schedules", "pgclaim_schedule_runs", "pgclaim_locks", "pgclaim_ticks", "pgclaim_terms"); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	h, err := status.New(status.Config{
		Pool: pool, Tables: specs, Grace: *grace, Refresh: *refresh, Names: names, Actions: *token != "", Logger: log,
		Operator: func(r *http.Request) string { return "pgclaim serve (" + r.RemoteAddr + ")" },
	})
	if err != nil {
		return usagef("%s", strings.TrimPrefix(flagNames.Replace(err.Error()), "status: invalid config: "))
	}
	var handler http.Handler = h
	if *token != "" {
		handler = tokenAuth(*token, h)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return failf("pick another --addr", "cannot listen on %s: %v", *addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	mode := "read-only (actions disabled; pass --action-token or set " + envActionToken + " to enable them)"
	if *token != "" {
		mode = "actions enabled for those who log in at /login with the action token"
	}
	fmt.Fprintf(e.stderr, "serving the status page on http://%s/ — %s\n", ln.Addr(), mode)
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(e.stderr, "warning: %s is not a loopback address: the page is reachable from other hosts\n", host)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return failf("", "serving: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return failf("", "shutting down: %v", err)
	}
	return nil
}

// parseTableSpec parses --table's NAME[:OPTION=VALUE,...].
func parseTableSpec(s string) (status.Table, error) {
	name, opts, _ := strings.Cut(s, ":")
	t := status.Table{Table: claim.Table{Name: strings.TrimSpace(name)}}
	if t.Name == "" {
		return t, usagef("--table %q: the table's name is required", s)
	}
	if opts == "" {
		return t, nil
	}
	for _, kv := range strings.Split(opts, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return t, usagef("--table %q: %q is not OPTION=VALUE", s, kv)
		}
		switch k {
		case "state":
			t.State = v
		case "claimed_at":
			t.ClaimedAt = v
		case "lease_until":
			t.LeaseUntil = v
		case "reason":
			t.Reason = v
		case "processing":
			t.Processing = v
		case "stale_after":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return t, usagef("--table %q: stale_after %q is not a positive duration", s, v)
			}
			t.StaleAfter = d
		default:
			return t, usagef("--table %q: unknown option %q: want state, claimed_at, lease_until, reason, processing or stale_after", s, k)
		}
	}
	return t, nil
}

// actionCookie carries the action token of a logged-in operator.
const actionCookie = "pgclaim_action_token"

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgclaim · log in</title>
<style>body{font:14px system-ui,sans-serif;margin:3em}input{font:inherit}</style></head>
<body><h1>pgclaim status: log in to act</h1>
{{if .}}<p style="color:#a4161a">{{.}}</p>{{end}}
<form method="post" action="login"><label>Action token <input type="password" name="token" autofocus required></label> <button>Log in</button></form>
<p><a href="./">Back to the page</a> (read-only without logging in)</p></body></html>`))

// tokenAuth lets POSTs through only from a client that presents the action
// token: as a cookie set by logging in at /login, or as an
// "Authorization: Bearer" header. GETs pass (the page is read-only to
// them).
func tokenAuth(token string, next http.Handler) http.Handler {
	match := func(s string) bool { return subtle.ConstantTimeCompare([]byte(s), []byte(token)) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/login" {
			if r.Method != http.MethodPost {
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				_ = loginPage.Execute(w, "")
				return
			}
			if !match(r.PostFormValue("token")) {
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				w.WriteHeader(http.StatusForbidden)
				_ = loginPage.Execute(w, "wrong token")
				return
			}
			http.SetCookie(w, &http.Cookie{Name: actionCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			w.Header().Set("Location", "./")
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		c, _ := r.Cookie(actionCookie)
		if !match(bearer) && (c == nil || !match(c.Value)) {
			http.Error(w, "refused: log in at /login with the action token first", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
