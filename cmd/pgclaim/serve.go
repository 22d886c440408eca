package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/status"
)

func init() {
	register(command{name: "serve", summary: "serve the status page (read-only unless given an action token)", run: runServe})
}

// Environment variables read when their flag is not given.
const (
	envActionToken    = "PGCLAIM_ACTION_TOKEN"    // --action-token
	envSessionKey     = "PGCLAIM_SESSION_KEY"     // --session-key
	envTrustedProxies = "PGCLAIM_TRUSTED_PROXIES" // --trusted-proxy, comma-separated
)

// maxRequestBody bounds every request's body.
const maxRequestBody = 64 << 10

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
that token, and every action also carries a CSRF token. The token must be at
least 16 random characters ('openssl rand -hex 16'); a login sets a signed
session cookie (not the token) that expires after --session or at /logout.
Sessions are signed with a key derived from --session-key (or
` + envSessionKey + `), else from the action token: replicas given the
same secret accept each other's sessions, a restart keeps them, and changing
the secret ends them all (a logout ends a session on the replica that served
it). Failed logins are logged and slowed down per client; one client's
failures never refuse another. Behind a reverse proxy, name it with
--trusted-proxy (or ` + envTrustedProxies + `): the client is then read
from the header --client-ip-header names, and never from an untrusted peer's
headers. Actions are recorded as done by the session. Off loopback, serve
HTTPS with --tls-cert and --tls-key (or put it behind a TLS proxy): without
TLS the token travels in clear text.

--table takes NAME, or NAME:OPTION=VALUE,... with the options state,
claimed_at, lease_until, reason (its columns, as 'pgclaim claims' takes
them), processing (the state of claimed rows) and stale_after (a duration),
for example --table 'push_requests:reason=fail_reason,lease_until=lease_until'.`

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "serve [--addr HOST:PORT] [--table SPEC]... [--action-token TOKEN [--session-key SECRET]] [--trusted-proxy CIDR]... [--tls-cert FILE --tls-key FILE] [--database-url URL]", serveAbout)
	addr := f.String("addr", defaultServeAddr, "listen on `HOST:PORT`")
	var tables, names stringList
	f.Var(&tables, "table", "show the claimed table `SPEC` (repeatable; see above)")
	f.Var(&names, "name", "also resolve the advisory locks of the job or election called `NAME` (repeatable)")
	token := f.String("action-token", "", "enable actions for those who log in with `TOKEN` (default: $"+envActionToken+")")
	sessionKey := f.String("session-key", "", "sign sessions with a key derived from `SECRET`, the same on every replica (default: $"+envSessionKey+", else the action token)")
	var proxies stringList
	f.Var(&proxies, "trusted-proxy", "read the client's address from --client-ip-header of requests from `CIDR` (repeatable or comma-separated; default: $"+envTrustedProxies+"; none: the peer is the client)")
	clientHeader := f.String("client-ip-header", "X-Forwarded-For", "the `HEADER` in which a trusted proxy names the client: X-Forwarded-For or Forwarded")
	grace := graceFlag(f)
	refresh := f.Duration("refresh", 5*time.Second, "the page reloads itself every `DURATION`")
	sessionTTL := f.Duration("session", 8*time.Hour, "a login lasts `DURATION` (or until logging out)")
	certFile := f.String("tls-cert", "", "serve HTTPS with the certificate in `FILE` (PEM; with --tls-key)")
	keyFile := f.String("tls-key", "", "the certificate's private key in `FILE` (PEM; with --tls-cert)")
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
	if *token != "" {
		if err := checkSecret("action token", *token); err != nil {
			return usagef("%v", err)
		}
	}
	if *sessionKey == "" {
		*sessionKey = e.getenv(envSessionKey)
	}
	if *sessionKey != "" {
		if *token == "" {
			return usagef("--session-key signs the sessions of an action token: give --action-token too")
		}
		if err := checkSecret("session key", *sessionKey); err != nil {
			return usagef("%v", err)
		}
	}
	if len(proxies) == 0 && e.getenv(envTrustedProxies) != "" {
		proxies = stringList{e.getenv(envTrustedProxies)}
	}
	trusted, err := parseProxies(proxies)
	if err != nil {
		return err
	}
	if h := http.CanonicalHeaderKey(*clientHeader); h != "X-Forwarded-For" && h != "Forwarded" {
		return usagef("--client-ip-header %q: want X-Forwarded-For or Forwarded", *clientHeader)
	}
	if *sessionTTL <= 0 {
		return usagef("--session must be positive, got %v", *sessionTTL)
	}
	if (*certFile == "") != (*keyFile == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	var tlsCfg *tls.Config
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return usagef("--tls-cert, --tls-key: %v", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
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
	cfg := status.Config{Pool: pool, Tables: specs, Grace: *grace, Refresh: *refresh, Names: names, Actions: *token != "", Logger: log, Schema: f.schema}
	if *token != "" {
		cfg.Operator = func(r *http.Request) string {
			who, _ := actorOf(r)
			return "pgclaim serve: " + who
		}
		cfg.Authenticated = func(r *http.Request) bool { _, ok := actorOf(r); return ok }
		cfg.LoginPath, cfg.LogoutPath = "login", "logout"
	}
	h, err := status.New(cfg)
	if err != nil {
		return usagef("%s", strings.TrimPrefix(flagNames.Replace(err.Error()), "status: invalid config: "))
	}
	var handler http.Handler = h
	if *token != "" {
		handler = newTokenAuth(authConfig{Token: *token, SessionKey: *sessionKey, TTL: *sessionTTL, TrustedProxies: trusted, ClientHeader: *clientHeader}, log, h)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return failf("pick another --addr", "cannot listen on %s: %v", *addr, err)
	}
	srv := &http.Server{
		Handler: http.MaxBytesHandler(handler, maxRequestBody), TLSConfig: tlsCfg,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	mode := "read-only (actions disabled; pass --action-token or set " + envActionToken + " to enable them)"
	if *token != "" {
		mode = "actions enabled for those who log in at /login with the action token"
	}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	fmt.Fprintf(e.stderr, "serving the status page on %s://%s/ — %s\n", scheme, ln.Addr(), mode)
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		switch {
		case tlsCfg != nil:
			fmt.Fprintf(e.stderr, "warning: %s is not a loopback address: the page is reachable from other hosts\n", host)
		case *token != "":
			fmt.Fprintf(e.stderr, "warning: %s is not a loopback address and --tls-cert is not given: the page is reachable from other hosts, and the action token and session cookie travel in clear text; serve HTTPS (--tls-cert, --tls-key) or bind loopback behind a TLS proxy\n", host)
		default:
			fmt.Fprintf(e.stderr, "warning: %s is not a loopback address and --tls-cert is not given: the page is reachable from other hosts, in clear text\n", host)
		}
	}
	done := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			done <- srv.ServeTLS(ln, "", "")
			return
		}
		done <- srv.Serve(ln)
	}()
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

// parseProxies parses --trusted-proxy: CIDRs or addresses, comma-separated.
func parseProxies(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, l := range list {
		for _, s := range strings.Split(l, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return nil, usagef("--trusted-proxy %q: not a CIDR (10.0.0.0/8) or an address", s)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if p.Addr().Is4In6() { // as addresses are compared: unmapped
				p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
			}
			out = append(out, p.Masked())
		}
	}
	return out, nil
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
