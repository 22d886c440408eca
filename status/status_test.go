package status_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/status"
	"github.com/pgclaim/pgclaim/status/internal/scenario"
	"github.com/pgclaim/pgclaim/store"
)

// serve starts the scenario and the page (actions as given) on an
// httptest server, mounted under /pgclaim/ as an application would.
func serve(t *testing.T, actions bool) (*scenario.Scenario, *httptest.Server) {
	t.Helper()
	db := pgtest.NewDatabase(t)
	sc := scenario.Start(t, db.Pool)
	h, err := status.New(status.Config{
		Pool: db.Pool, Tables: scenario.Tables(), Grace: scenario.Grace, Actions: actions,
		Names: []string{scenario.Running}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/pgclaim/", http.StripPrefix("/pgclaim", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return sc, srv
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func getJSON[T any](t *testing.T, c *http.Client, u string) T {
	t.Helper()
	code, body := get(t, c, u)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", u, code, body)
	}
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("GET %s: %v\n%s", u, err, body)
	}
	return v
}

func findSchedule(t *testing.T, all status.Schedules, name string) status.Schedule {
	t.Helper()
	for _, s := range all.Schedules {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("schedule %q not listed: %+v", name, all)
	return status.Schedule{}
}

func hasState(runs []status.Run, state string) bool {
	for _, r := range runs {
		if r.State == state {
			return true
		}
	}
	return false
}

func TestViews(t *testing.T) {
	sc, srv := serve(t, false)
	c := srv.Client()
	base := srv.URL + "/pgclaim/"
	// How long runs are kept, as a retention pass reported it.
	if _, err := sc.Pool.Exec(context.Background(), `UPDATE pgclaim_schedules SET retention_us = 604800000000 WHERE name = $1`, scenario.Paused); err != nil {
		t.Fatal(err)
	}

	all := getJSON[status.Schedules](t, c, base+"schedules.json")
	if alt := getJSON[status.Schedules](t, c, base+"schedules?format=json"); len(alt.Schedules) != len(all.Schedules) {
		t.Fatalf("?format=json lists %d schedules, .json %d", len(alt.Schedules), len(all.Schedules))
	}
	if len(all.Schedules) != 5 {
		t.Fatalf("want 5 schedules, got %d", len(all.Schedules))
	}
	if s := findSchedule(t, all, scenario.Running); !hasState(s.Timeline, "running") || s.NextDue == nil ||
		s.NextDue.Format("15:04:05") != "03:00:00" || !s.NextDue.After(all.DBNow) {
		t.Errorf("%s: want a running run and next due at 03:00 after %v, got %+v", scenario.Running, all.DBNow, s)
	}
	if s := findSchedule(t, all, scenario.Missed); s.Missed < 1 || !hasState(s.Timeline, "missed") {
		t.Errorf("%s: want missed instants, got %+v", scenario.Missed, s)
	}
	if s := findSchedule(t, all, scenario.Paused); !s.Paused || deref(s.PausedNote) != scenario.PausedNote || deref(s.PausedBy) != "ops@example.com" ||
		deref(s.Retention) != "168h0m0s" {
		t.Errorf("%s: want paused with its note, got %+v", scenario.Paused, s)
	}
	if s := findSchedule(t, all, scenario.Hostile); s.Last == nil || s.Last.State != "failed" || !strings.HasSuffix(deref(s.Last.Reason), scenario.HostileReason) {
		t.Errorf("%s: want its failed run with the reason, got %+v (reason %q)", scenario.Hostile, s.Last, deref(s.Last.Reason))
	}

	code, html := get(t, c, base)
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, html)
	}
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`,
		`&lt;img src=x onerror=&#34;alert(2)&#34;&gt; upstream 503`,
		`vendor API down &lt;i&gt;ticket 42&lt;/i&gt;`,
		`data-state="running"`, `data-state="missed"`, `paused-badge`, `missed-count`,
		`read-only`, `runs kept: 7d`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the schedules page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script>", "<img", "<i>ticket", "actions/pause"} {
		if strings.Contains(html, bad) {
			t.Errorf("the schedules page contains %q", bad)
		}
	}

	cl := getJSON[status.Claims](t, c, base+"claims.json")
	if len(cl.Tables) != 1 || cl.Tables[0].Error != "" {
		t.Fatalf("claims: %+v", cl)
	}
	if tb := cl.Tables[0]; tb.Stale != 1 || tb.ProcessingRows != 2 || len(tb.Reasons) != 1 || tb.Reasons[0].Reason != scenario.HostileReason {
		t.Errorf("claims: want 2 processing rows, 1 stuck, the hostile reason; got %+v", tb)
	}
	if _, html := get(t, c, base+"claims"); !strings.Contains(html, "1 stuck") || strings.Contains(html, "<img") {
		t.Errorf("the claims page does not show the stuck row escaped:\n%s", html)
	}

	type lockList struct {
		Leases []struct {
			Name, Holder string
			Fence        int64
			Expired      bool
		}
		Advisory []struct {
			Name, Kind string
			Holder     *string
		}
	}
	locks := getJSON[lockList](t, c, base+"locks.json")
	if len(locks.Leases) != 1 || locks.Leases[0].Name != scenario.Lease || locks.Leases[0].Expired {
		t.Errorf("locks: want the held lease %s, got %+v", scenario.Lease, locks.Leases)
	}
	var guarded []string
	for _, a := range locks.Advisory {
		guarded = append(guarded, a.Name+" ("+a.Kind+", "+deref(a.Holder)+")")
	}
	if g := strings.Join(guarded, ", "); !strings.Contains(g, scenario.Election+" (election, instance-a)") ||
		!strings.Contains(g, scenario.Running+" (schedule, instance-a)") {
		t.Errorf("advisory locks: want the election's lock and the running schedule's, with their holder; got %s", g)
	}

	ld := getJSON[status.Leaders](t, c, base+"leaders.json")
	if len(ld.Open) != 1 || ld.Open[0].Election != scenario.Election || ld.Open[0].Holder != "instance-a" || len(ld.Recent) != 1 {
		t.Errorf("leaders: want %s led by instance-a, got %+v", scenario.Election, ld)
	}
	for _, p := range []string{"leaders", "locks"} {
		if code, html := get(t, c, base+p); code != http.StatusOK || !strings.Contains(html, scenario.Election) {
			t.Errorf("GET %s: %d, want the election listed:\n%s", p, code, html)
		}
	}
	if code, _ := get(t, c, base+"nope"); code != http.StatusNotFound {
		t.Errorf("GET /nope: %d, want 404", code)
	}
}

// post sends an action's form.
func post(t *testing.T, c *http.Client, u string, form url.Values, header ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

func TestReadOnlyRefusesActions(t *testing.T) {
	sc, srv := serve(t, false)
	code, _, body := post(t, srv.Client(), srv.URL+"/pgclaim/actions/pause", url.Values{"name": {scenario.Ticking}, "note": {"x"}})
	if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("POST pause on a read-only page: %d %s", code, body)
	}
	if st, err := sc.Operator.Status(t.Context(), scenario.Ticking); err != nil || st.Paused {
		t.Fatalf("paused %v, %v: a read-only page changed the schedule", st.Paused, err)
	}
}

// csrfClient returns a client with a cookie jar that does not follow
// redirects, and the CSRF token the page rendered.
func csrfClient(t *testing.T, srv *httptest.Server) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	_, html := get(t, c, srv.URL+"/pgclaim/schedules")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindStringSubmatch(html)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", html)
	}
	return c, m[1]
}

func TestActions(t *testing.T) {
	sc, srv := serve(t, true)
	ctx := t.Context()
	c, tok := csrfClient(t, srv)
	act := srv.URL + "/pgclaim/actions/"

	// Refused: no token, a wrong one, the right one from another site,
	// the right one without the cookie.
	for _, tc := range []struct {
		name   string
		form   url.Values
		header []string
		client *http.Client
	}{
		{"no token", url.Values{}, nil, c},
		{"wrong token", url.Values{"csrf": {strings.Repeat("0", 64)}}, nil, c},
		{"cross-site", url.Values{"csrf": {tok}}, []string{"Sec-Fetch-Site", "cross-site"}, c},
		{"no cookie", url.Values{"csrf": {tok}}, nil, srv.Client()},
	} {
		tc.form.Set("name", scenario.Ticking)
		tc.form.Set("note", "x")
		if code, _, body := post(t, tc.client, act+"pause", tc.form, tc.header...); code != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", tc.name, code, body)
		}
	}
	if st, _ := sc.Operator.Status(ctx, scenario.Ticking); st.Paused {
		t.Fatal("a refused action paused the schedule")
	}
	if code, _, _ := post(t, c, act+"pause", url.Values{"csrf": {tok}, "name": {scenario.Ticking}}); code != http.StatusSeeOther {
		t.Errorf("pause without a note: %d, want 303 with the error", code)
	}

	form := url.Values{"csrf": {tok}, "name": {scenario.Ticking}, "note": {"deploying <b>v2</b>"}, "by": {"alice"}}
	code, loc, body := post(t, c, act+"pause", form)
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "../schedules?ok=") {
		t.Fatalf("pause: %d %q %s", code, loc, body)
	}
	st, err := sc.Operator.Status(ctx, scenario.Ticking)
	// The form's "by" names nobody: Config.Operator does.
	if err != nil || !st.Paused || st.PausedNote != "deploying <b>v2</b>" || st.PausedBy != "status page" {
		t.Fatalf("after pause: %+v, %v", st, err)
	}
	_, html := get(t, c, srv.URL+"/pgclaim/schedules?"+strings.SplitN(loc, "?", 2)[1])
	if !strings.Contains(html, "paused push-resume") || !strings.Contains(html, "deploying &lt;b&gt;v2&lt;/b&gt;") {
		t.Errorf("the page after pausing lacks the message or the escaped note:\n%s", html)
	}

	if code, _, _ := post(t, c, act+"resume", url.Values{"csrf": {tok}, "name": {scenario.Ticking}}); code != http.StatusSeeOther {
		t.Fatalf("resume: %d", code)
	}
	if st, _ := sc.Operator.Status(ctx, scenario.Ticking); st.Paused {
		t.Fatal("resume did not resume")
	}

	code, loc, _ = post(t, c, act+"trigger", url.Values{"csrf": {tok}, "name": {scenario.Paused}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "triggered") {
		t.Fatalf("trigger: %d %q", code, loc)
	}
	if st, _ := sc.Operator.Status(ctx, scenario.Paused); st.OpenRuns != 1 {
		t.Errorf("trigger of the paused schedule: %d open runs, want 1 (waiting for resume)", st.OpenRuns)
	}

	bf := url.Values{"csrf": {tok}, "name": {scenario.Paused}, "from": {"2026-03-01T00:00"}, "to": {"2026-03-04T00:00"}, "max": {"10"}}
	code, loc, _ = post(t, c, act+"backfill", bf)
	if code != http.StatusSeeOther || !strings.Contains(loc, "dry+run") {
		t.Errorf("backfill (dry run): %d %q", code, loc)
	}
	if code, _, _ := post(t, c, act+"trigger", url.Values{"csrf": {tok}, "name": {"no-such"}}); code != http.StatusSeeOther {
		t.Errorf("trigger of an unknown schedule: %d, want 303 with the error", code)
	}

	// Release: a stale fence releases nothing; the lease's own fence does.
	q := store.New(sc.Pool)
	fence := sc.LeaseHandle.Fence()
	code, loc, _ = post(t, c, act+"release", url.Values{"csrf": {tok}, "name": {scenario.Lease}, "fence": {itoa(fence + 1)}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "../locks?failed=") {
		t.Errorf("release with a stale fence: %d %q", code, loc)
	}
	if l, err := q.LeaseByName(ctx, scenario.Lease); err != nil || !l.Held {
		t.Fatalf("a release with a stale fence freed the lease: %+v %v", l, err)
	}
	code, loc, _ = post(t, c, act+"release", url.Values{"csrf": {tok}, "name": {scenario.Lease}, "fence": {itoa(fence)}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "../locks?ok=") {
		t.Errorf("release: %d %q", code, loc)
	}
	if l, err := q.LeaseByName(ctx, scenario.Lease); err != nil || l.Held {
		t.Fatalf("after release: %+v %v", l, err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestNewRefusesBadConfig(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, cfg := range []status.Config{
		{},
		{Pool: pool, Grace: -time.Second},
		{Pool: pool, QueryTimeout: -time.Second},
		{Pool: pool, MaxReads: -1},
		{Pool: pool, Tables: []status.Table{{Table: claim.Table{Name: ""}}}},
		{Pool: pool, Tables: []status.Table{{Table: claim.Table{Name: "t", State: "bad\x00col"}}}},
		{Pool: pool, Schema: "Bad"},
	} {
		if _, err := status.New(cfg); !errors.Is(err, status.ErrInvalid) {
			t.Errorf("New(%+v): %v, want ErrInvalid", cfg, err)
		} else if cfg.Schema != "" && !strings.Contains(err.Error(), "Config.Schema") {
			t.Errorf("New(Schema %q): %v, want an error naming Config.Schema", cfg.Schema, err)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
