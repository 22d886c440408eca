package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
	re := regexp.MustCompile(`on (https?://\S+/) `)
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
		{"serve", "--action-token", "aaaaaaaaaaaaaaaa"},
		{"serve", "--action-token", "abcdabcdabcdabcdabcd"},
		{"serve", "--action-token", "aabbaabbaabbaabbaabbaabbaabbaabbaabb"},
		{"serve", "--tls-cert", "cert.pem"},
		{"serve", "--tls-cert", "nope.pem", "--tls-key", "nope.key"},
		{"serve", "--addr", "nope"},
		{"serve", "--table", "t:color=red"},
		{"serve", "--table", "t:stale_after=-1h"},
		{"serve", "extra"},
		{"serve", "--session-key", "9f86d081884c7d659a2feaa0c55ad015"},
		{"serve", "--action-token", "correct-horse-battery-staple", "--session-key", "short"},
		{"serve", "--trusted-proxy", "10.0.0.0/33"},
		{"serve", "--trusted-proxy", "proxy.example"},
		{"serve", "--client-ip-header", "X-Real-IP"},
	} {
		r := cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}, args...)
		wantCode(t, r, 2)
	}
}

// reportDB returns a database with a schedule "report" registered.
func reportDB(t *testing.T) *pgtest.Database {
	t.Helper()
	db := pgtest.NewDatabase(t)
	s, err := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(context.Background(), schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1}, func(context.Context, schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestServe(t *testing.T) {
	db := reportDB(t)
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
		c := newClient()
		if code := postForm(t, c, base+"actions/pause", url.Values{"name": {"report"}, "note": {"x"}}); code != http.StatusUnauthorized {
			t.Fatalf("pause before logging in: %d, want 401", code)
		}
		if code := postForm(t, c, base+"login", url.Values{"token": {"wrong-token-wrong-token"}}); code != http.StatusForbidden {
			t.Fatalf("login with a wrong token: %d, want 403", code)
		}
		if code := postForm(t, c, base+"login", url.Values{"token": {token}}); code != http.StatusSeeOther {
			t.Fatalf("login: %d, want 303", code)
		}
		// The session cookie is not the token: signed, expiring, HttpOnly.
		u, _ := url.Parse(base)
		var session string
		for _, ck := range c.Jar.Cookies(u) {
			if ck.Name == sessionCookie {
				session = ck.Value
			}
			if strings.Contains(ck.Value, token) {
				t.Errorf("cookie %s carries the action token", ck.Name)
			}
		}
		if session == "" {
			t.Fatal("no session cookie after logging in")
		}
		// The form's "by" does not name who acted: the session does.
		csrf := csrfOf(t, c, base)
		if code := postForm(t, c, base+"actions/pause", url.Values{"csrf": {csrf}, "name": {"report"}, "note": {"release"}, "by": {"mallory"}}); code != http.StatusSeeOther {
			t.Fatalf("pause after logging in: %d, want 303", code)
		}
		r := cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": db.URL}, "schedules", "list")
		wantCode(t, r, 0)
		wantContains(t, "schedules list", r.stdout, "by pgclaim serve: action token (session ", ": release")
		if strings.Contains(r.stdout, "mallory") {
			t.Errorf("the form's by field was recorded:\n%s", r.stdout)
		}
		// Logging out ends the session, even for a copy of its cookie.
		if code := postForm(t, c, base+"logout", nil); code != http.StatusSeeOther {
			t.Fatalf("logout: %d, want 303", code)
		}
		replay := newClient()
		replay.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: session}})
		if code := postForm(t, replay, base+"actions/resume", url.Values{"csrf": {csrf}, "name": {"report"}}); code != http.StatusUnauthorized {
			t.Fatalf("resume with the logged-out session's cookie: %d, want 401", code)
		}
		// Failed logins are logged and, past a few, refused for a while.
		for i := range loginFreeFailures + 1 {
			code := postForm(t, c, base+"login", url.Values{"token": {"guess-guess-guess-" + strconv.Itoa(i)}})
			if want := http.StatusForbidden; i == loginFreeFailures {
				want = http.StatusTooManyRequests
				if code != want {
					t.Fatalf("login after %d failures: %d, want %d", i, code, want)
				}
			} else if code != want {
				t.Fatalf("failed login %d: %d, want %d", i+1, code, want)
			}
		}
		if code := postForm(t, c, base+"login", url.Values{"token": {token}}); code != http.StatusTooManyRequests {
			t.Errorf("the right token while refused: %d, want 429", code)
		}
		wantContains(t, "stderr", stderr.String(), "failed login", "client=127.0.0.1", "refused_until=")
		if strings.Contains(stderr.String(), "guess-guess") {
			t.Errorf("a failed login logged the token tried:\n%s", stderr.String())
		}
	})

	t.Run("login body bounded", func(t *testing.T) {
		base, _ := startServe(t, map[string]string{"DATABASE_URL": db.URL, envActionToken: "correct-horse-battery-staple"})
		resp, err := http.Post(base+"login", "application/x-www-form-urlencoded", strings.NewReader("token="+strings.Repeat("x", 1<<20)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("a 1 MiB login form: %d, want 413", resp.StatusCode)
		}
	})

	t.Run("tls", func(t *testing.T) {
		cert, key := selfSigned(t)
		base, _ := startServe(t, map[string]string{"DATABASE_URL": db.URL}, "--tls-cert", cert, "--tls-key", key)
		if !strings.HasPrefix(base, "https://") {
			t.Fatalf("serving %s, want https", base)
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := c.Get(base + "schedules")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.TLS == nil {
			t.Fatalf("GET over TLS: %d", resp.StatusCode)
		}
	})

	t.Run("not loopback", func(t *testing.T) {
		_, stderr := startServe(t, map[string]string{"DATABASE_URL": db.URL, envActionToken: "correct-horse-battery-staple"}, "--addr", "0.0.0.0:0")
		wantContains(t, "stderr", stderr.String(), "not a loopback address", "travel in clear text", "--tls-cert")
	})
}

func newClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func postForm(t *testing.T, c *http.Client, u string, form url.Values) int {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// csrfOf returns the CSRF token of the page as c sees it.
func csrfOf(t *testing.T, c *http.Client, base string) string {
	t.Helper()
	tok, page := pageCSRF(t, c, base)
	if tok == "" {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return tok
}

// pageCSRF returns the CSRF token of the page as c sees it ("" if it shows
// none: only to a logged-in session) and the page.
func pageCSRF(t *testing.T, c *http.Client, base string) (string, []byte) {
	t.Helper()
	resp, err := c.Get(base + "schedules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(b); m != nil {
		return string(m[1]), b
	}
	return "", b
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
