package status_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
	"github.com/pgclaim/pgclaim/status"
	"github.com/pgclaim/pgclaim/status/inspect"
	"github.com/pgclaim/pgclaim/status/internal/scenario"
)

// The page's backfill is bounded (the way past the limit is named), and a
// recorded backfill is cancelled from the page.
func TestBackfillBoundedAndCancelled(t *testing.T) {
	sc, srv := serve(t, true)
	ctx := t.Context()
	c, tok := csrfClient(t, srv)
	act := srv.URL + "/pgclaim/actions/"
	bf := url.Values{"csrf": {tok}, "name": {scenario.Paused}, "from": {"2026-03-01T00:00"}, "to": {"2026-03-04T00:00"}, "max": {"5000000"}}
	code, loc, _ := post(t, c, act+"backfill", bf)
	if msg, _ := url.QueryUnescape(loc); code != http.StatusSeeOther || !strings.Contains(msg, "failed=max: 5000000 is above the limit of 10000") || !strings.Contains(msg, "--above-limit") {
		t.Fatalf("backfill with max 5000000: %d %q, want refused naming the limit", code, msg)
	}
	before, err := sc.Operator.Status(ctx, scenario.Paused)
	if err != nil {
		t.Fatal(err)
	}
	bf.Set("max", "10")
	bf.Set("record", "yes")
	if code, loc, _ = post(t, c, act+"backfill", bf); code != http.StatusSeeOther || !strings.Contains(loc, "ok=") {
		t.Fatalf("backfill: %d %q", code, loc)
	}
	mid, _ := sc.Operator.Status(ctx, scenario.Paused)
	if mid.OpenRuns <= before.OpenRuns {
		t.Fatalf("backfill recorded nothing: %d open runs before, %d after", before.OpenRuns, mid.OpenRuns)
	}
	code, loc, _ = post(t, c, act+"cancel-backfill", url.Values{"csrf": {tok}, "name": {scenario.Paused}})
	if msg, _ := url.QueryUnescape(loc); code != http.StatusSeeOther || !strings.Contains(msg, fmt.Sprintf("ok=cancelled %d backfilled runs", mid.OpenRuns-before.OpenRuns)) {
		t.Fatalf("cancel-backfill: %d %q", code, msg)
	}
	if after, _ := sc.Operator.Status(ctx, scenario.Paused); after.OpenRuns != before.OpenRuns {
		t.Errorf("after cancel-backfill: %d open runs, want %d", after.OpenRuns, before.OpenRuns)
	}
}

// A view's reads end after QueryTimeout, and no more than MaxReads views
// are read at once: the others are answered 503 instead of queueing on
// the pool.
func TestReadsBounded(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (id int PRIMARY KEY, status text, claimed_at timestamptz)`); err != nil {
			t.Fatal(err)
		}
	}
	h, err := status.New(status.Config{
		Pool: db.Pool, Logger: slog.New(slog.DiscardHandler), QueryTimeout: time.Second, MaxReads: 1,
		Tables: []status.Table{{Table: claim.Table{Name: "a"}}, {Table: claim.Table{Name: "b"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	// Another session holds both tables: the counts wait for its lock.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE a, b IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	var first struct {
		code int
		body string
		took time.Duration
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		first.code, first.body = get(t, c, srv.URL+"/claims.json")
		first.took = time.Since(start)
	}()
	time.Sleep(200 * time.Millisecond)
	resp, err := c.Get(srv.URL + "/claims.json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a second view while the first is read (MaxReads 1): %d, want 503 with Retry-After", resp.StatusCode)
	}
	wg.Wait()
	if first.took > 4*time.Second || !strings.Contains(first.body, "statement timeout") {
		t.Errorf("claims behind a lock: %d after %v:\n%s\nwant the statement timeout's error within the timeouts", first.code, first.took, first.body)
	}
}

// A large table's rows per state are estimated from a sample, and the page
// says so; the rows in progress are counted.
func TestClaimsEstimated(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE big (id int PRIMARY KEY, status text, claimed_at timestamptz);
INSERT INTO big SELECT i, CASE WHEN i % 4 = 0 THEN 'PROCESSING' ELSE 'DONE' END, now() FROM generate_series(1, 4000) i;
ANALYZE big`); err != nil {
		t.Fatal(err)
	}
	h, err := status.New(status.Config{
		Pool: db.Pool, Logger: slog.New(slog.DiscardHandler),
		Tables: []status.Table{{Table: claim.Table{Name: "big"}, EstimateAbove: 1000}, {Table: claim.Table{Name: "big"}, EstimateAbove: -1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	got := getJSON[status.Claims](t, srv.Client(), srv.URL+"/claims.json")
	est, exact := got.Tables[0], got.Tables[1]
	if !est.Estimated || est.EstimatedRows != 4000 || est.ProcessingRows != 1000 || exact.Estimated {
		t.Errorf("claims: estimated %+v; counted %+v", est, exact)
	}
	var sum int64
	for _, s := range est.States {
		sum += s.Rows
	}
	if sum < 3900 || sum > 4100 {
		t.Errorf("estimated rows per state sum to %d, want about 4000: %+v", sum, est.States)
	}
	if _, html := get(t, srv.Client(), srv.URL+"/claims"); !strings.Contains(html, "are estimates") || !strings.Contains(html, "Rows (estimated)") {
		t.Errorf("the page does not say the counts are estimates:\n%s", html)
	}
}

// With Config.Authenticated, an anonymous viewer gets no action forms and
// its actions are refused; an authenticated one acts as Config.Operator
// names it, and is offered a log out.
func TestAuthenticatedActions(t *testing.T) {
	sc, _ := serve(t, false)
	h, err := status.New(status.Config{
		Pool: sc.Pool, Tables: scenario.Tables(), Grace: scenario.Grace, Actions: true, Logger: slog.New(slog.DiscardHandler),
		Authenticated: func(r *http.Request) bool { return r.Header.Get("X-User") != "" },
		Operator:      func(r *http.Request) string { return "user " + r.Header.Get("X-User") },
		LoginPath:     "login", LogoutPath: "logout",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	_, html := get(t, srv.Client(), srv.URL+"/schedules")
	if strings.Contains(html, `name="csrf"`) || !strings.Contains(html, `id="login" href="login"`) {
		t.Errorf("anonymous: action forms shown, or no log in link:\n%s", html)
	}
	if code, _, body := post(t, srv.Client(), srv.URL+"/actions/pause", url.Values{"name": {scenario.Ticking}, "note": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("anonymous pause: %d %s, want 401", code, body)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Transport: userTransport("alice"), CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	_, html = get(t, c, srv.URL+"/schedules")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindStringSubmatch(html)
	if m == nil || !strings.Contains(html, `<form class="inline" method="post" action="logout">`) {
		t.Fatalf("authenticated: no action forms or no log out:\n%s", html)
	}
	if code, _, _ := post(t, c, srv.URL+"/actions/pause", url.Values{"csrf": {m[1]}, "name": {scenario.Ticking}, "note": {"x"}, "by": {"mallory"}}); code != http.StatusSeeOther {
		t.Fatalf("authenticated pause: %d", code)
	}
	if st, err := sc.Operator.Status(t.Context(), scenario.Ticking); err != nil || st.PausedBy != "user alice" {
		t.Errorf("paused by %q (%v), want the authenticated user", st.PausedBy, err)
	}
}

// userTransport sends X-User: name with every request.
type userTransport string

func (u userTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-User", string(u))
	return http.DefaultTransport.RoundTrip(r)
}

// An anonymous viewer sees that a read failed, not the connection's user,
// database, host and port; an authenticated one (or with
// AnonymousDetails) sees the error in full.
func TestAnonymousErrorsWithoutConnectionDetails(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://secretuser:pw@127.0.0.1:1/secretdb?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, tc := range []struct {
		name string
		cfg  status.Config
		full bool
	}{
		{"anonymous", status.Config{}, false},
		{"AnonymousDetails", status.Config{AnonymousDetails: true}, true},
		{"authenticated", status.Config{Authenticated: func(*http.Request) bool { return true }}, true},
	} {
		tc.cfg.Pool, tc.cfg.Logger = pool, slog.New(slog.DiscardHandler)
		h, err := status.New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/schedules", "/schedules.json", "/locks"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			body := rec.Body.String()
			leaks := strings.Contains(body, "secretuser") || strings.Contains(body, "secretdb") || strings.Contains(body, "127.0.0.1:1")
			if rec.Code != http.StatusInternalServerError || leaks != tc.full {
				t.Errorf("%s GET %s: %d, connection details shown %v, want %v:\n%s", tc.name, path, rec.Code, leaks, tc.full, body)
			}
		}
	}
}

// The locks view shows advisory locks' sessions (pids, applications,
// client addresses) to authenticated viewers only.
func TestLocksSessionsOnlyWhenLoggedIn(t *testing.T) {
	sc, _ := serve(t, false)
	h, err := status.New(status.Config{
		Pool: sc.Pool, Grace: scenario.Grace, Logger: slog.New(slog.DiscardHandler), Names: []string{scenario.Running},
		Authenticated: func(r *http.Request) bool { return r.Header.Get("X-User") != "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	anon := getJSON[inspect.Locks](t, srv.Client(), srv.URL+"/locks.json")
	if len(anon.Advisory) == 0 {
		t.Fatal("no advisory locks in the scenario")
	}
	for _, a := range anon.Advisory {
		if a.PID != nil || a.ClientAddr != nil || a.ApplicationName != nil {
			t.Errorf("anonymous: advisory lock %q shows its session: %+v", a.Name, a)
		}
	}
	if _, html := get(t, srv.Client(), srv.URL+"/locks"); strings.Contains(html, "<th>PID</th>") || strings.Contains(html, "<th>Client</th>") {
		t.Errorf("anonymous: the locks page has session columns:\n%s", html)
	}
	c := &http.Client{Transport: userTransport("alice")}
	authed := getJSON[inspect.Locks](t, c, srv.URL+"/locks.json")
	if len(authed.Advisory) == 0 || authed.Advisory[0].PID == nil {
		t.Errorf("authenticated: no pid shown: %+v", authed.Advisory)
	}
}
