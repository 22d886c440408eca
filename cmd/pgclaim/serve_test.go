package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// syncBuffer is a bytes buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs "pgclaim serve" on a free loopback port until the test
// ends and returns its base URL and standard error.
func startServe(t *testing.T, environ map[string]string, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, getenv: func(k string) string { return environ[k] }}
	done := make(chan int, 1)
	go func() { done <- runEnv(ctx, e, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d:\n%s", code, stderr.String())
		}
	})
	re := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m[1], &stderr
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("serve exited %d:\n%s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", stderr.String())
		}
	}
}

func TestServeUsage(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--action-token", "short"},
		{"serve", "--addr", "nope"},
		{"serve", "--table", "t:color=red"},
		{"serve", "--table", "t:stale_after=-1h"},
		{"serve", "extra"},
	} {
		r := cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}, args...)
		wantCode(t, r, 2)
	}
}

func TestServe(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1}, func(context.Context, schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	exec1(t, db, `CREATE TABLE jobs (id int PRIMARY KEY, status text, claimed_at timestamptz, why text)`)

	t.Run("read-only", func(t *testing.T) {
		base, stderr := startServe(t, map[string]string{"DATABASE_URL": db.URL}, "--table", "jobs:reason=why")
		wantContains(t, "stderr", stderr.String(), "read-only (actions disabled")
		resp, err := http.Get(base + "schedules")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantContains(t, "page", string(body), "report", "read-only")
		resp, err = http.Get(base + "claims.json")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		wantContains(t, "claims.json", string(body), `"table": "\"jobs\""`)
		resp, err = http.PostForm(base+"actions/pause", url.Values{"name": {"report"}, "note": {"x"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("POST pause: %d, want 403", resp.StatusCode)
		}
	})

	t.Run("action token", func(t *testing.T) {
		token := "correct-horse-battery-staple"
		base, stderr := startServe(t, map[string]string{"DATABASE_URL": db.URL, envActionToken: token})
		wantContains(t, "stderr", stderr.String(), "actions enabled")
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		page := func() string {
			resp, err := c.Get(base + "schedules")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page())
		if csrf == nil {
			t.Fatal("no CSRF token on the page")
		}
		pause := func() int {
			resp, err := c.PostForm(base+"actions/pause", url.Values{"csrf": {csrf[1]}, "name": {"report"}, "note": {"release"}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := pause(); code != http.StatusUnauthorized {
			t.Fatalf("pause before logging in: %d, want 401", code)
		}
		resp, err := c.PostForm(base+"login", url.Values{"token": {"wrong-token-wrong-token"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("login with a wrong token: %d, want 403", resp.StatusCode)
		}
		resp, err = c.PostForm(base+"login", url.Values{"token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("login: %d, want 303", resp.StatusCode)
		}
		if code := pause(); code != http.StatusSeeOther {
			t.Fatalf("pause after logging in: %d, want 303", code)
		}
		r := cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": db.URL}, "schedules", "list")
		wantCode(t, r, 0)
		wantContains(t, "schedules list", r.stdout, "by pgclaim serve (127.0.0.1:", ": release")
	})
}
