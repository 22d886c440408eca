package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Action tokens and sessions of "pgclaim serve".
//
// The token is checked for strength at start-up (checkTokenStrength) and
// compared by its SHA-256 digest in constant time, so neither its content
// nor its length leaks through timing. Logging in with it at /login sets a
// session cookie that is not the token: a random session id and an expiry,
// signed with a key drawn at start-up (HMAC-SHA256), valid until it expires,
// until /logout, or until serve restarts. Failed logins (and POSTs with a
// wrong bearer token) are logged with the client's address and limited:
// after loginFreeFailures failures a client waits, doubling up to
// maxLoginBackoff, and all clients together get at most
// globalFailuresPerMinute failures a minute.

const (
	// sessionCookie carries a logged-in operator's signed session.
	sessionCookie = "pgclaim_session"
	// minTokenBits is the least strength an action token must show.
	minTokenBits = 64
	// loginFreeFailures is how many failed logins a client has before it
	// must wait.
	loginFreeFailures = 5
	// maxLoginBackoff bounds a client's wait after failed logins.
	maxLoginBackoff = 5 * time.Minute
	// globalFailuresPerMinute bounds the failed logins of all clients.
	globalFailuresPerMinute = 30
	// maxLoginBody bounds the login form.
	maxLoginBody = 4 << 10
	// maxTrackedClients bounds the clients whose failures are remembered.
	maxTrackedClients = 10_000
)

// checkTokenStrength refuses a token that is short, a repetition, or of
// too few distinct characters: its strength is estimated as its length
// times log2 of its number of distinct characters.
func checkTokenStrength(tok string) error {
	const hint = "use at least 16 random characters, for example the output of 'openssl rand -hex 16'"
	if len(tok) < 16 {
		return fmt.Errorf("the action token is %d characters long: %s", len(tok), hint)
	}
	for p := 1; p <= len(tok)/2; p++ {
		if len(tok)%p == 0 && strings.Repeat(tok[:p], len(tok)/p) == tok {
			return fmt.Errorf("the action token repeats %q: %s", tok[:p], hint)
		}
	}
	distinct := map[rune]bool{}
	for _, r := range tok {
		distinct[r] = true
	}
	if bits := float64(len([]rune(tok))) * math.Log2(float64(len(distinct))); bits < minTokenBits {
		return fmt.Errorf("the action token is too weak (%d distinct characters in %d): %s", len(distinct), len(tok), hint)
	}
	return nil
}

// actorKey is the context key of the authenticated actor's name.
type actorKey struct{}

// actorOf returns the name of the operator a request was authenticated as.
func actorOf(r *http.Request) (string, bool) {
	s, ok := r.Context().Value(actorKey{}).(string)
	return s, ok
}

// tokenAuth authenticates the actions of "pgclaim serve".
type tokenAuth struct {
	digest  [sha256.Size]byte // of the action token
	key     []byte            // signs sessions
	ttl     time.Duration
	log     *slog.Logger
	now     func() time.Time
	cop     *http.CrossOriginProtection
	next    http.Handler
	mu      sync.Mutex
	revoked map[string]time.Time // session id -> its expiry
	clients map[string]*failures // by client address
	window  time.Time            // start of the global minute
	global  int                  // failures in it
}

type failures struct {
	n     int
	until time.Time // refused until then
}

func newTokenAuth(token string, ttl time.Duration, log *slog.Logger, next http.Handler) *tokenAuth {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails
	return &tokenAuth{
		digest: sha256.Sum256([]byte(token)), key: key, ttl: ttl, log: log, now: time.Now,
		cop: http.NewCrossOriginProtection(), next: next,
		revoked: map[string]time.Time{}, clients: map[string]*failures{},
	}
}

// match compares s with the token by digest, in constant time.
func (a *tokenAuth) match(s string) bool {
	d := sha256.Sum256([]byte(s))
	return subtle.ConstantTimeCompare(d[:], a.digest[:]) == 1
}

// newSession returns a signed session cookie's value: expiry.id.signature.
func (a *tokenAuth) newSession() (string, string, time.Time) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	exp := a.now().Add(a.ttl)
	payload := strconv.FormatInt(exp.Unix(), 10) + "." + id
	return payload + "." + a.sign(payload), id, exp
}

func (a *tokenAuth) sign(payload string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// session returns the id of the request's valid session.
func (a *tokenAuth) session(r *http.Request) (string, time.Time, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", time.Time{}, false
	}
	payload, sig, ok := cutLast(c.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(a.sign(payload))) {
		return "", time.Time{}, false
	}
	expS, id, _ := strings.Cut(payload, ".")
	sec, err := strconv.ParseInt(expS, 10, 64)
	exp := time.Unix(sec, 0)
	if err != nil || !a.now().Before(exp) {
		return "", time.Time{}, false
	}
	a.mu.Lock()
	_, gone := a.revoked[id]
	a.mu.Unlock()
	return id, exp, !gone
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// client names the request's client for the limits and the log.
func client(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// wait says how long the client must wait before trying again (0: not).
func (a *tokenAuth) wait(c string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if now.Sub(a.window) < time.Minute && a.global >= globalFailuresPerMinute {
		return a.window.Add(time.Minute).Sub(now)
	}
	if f := a.clients[c]; f != nil && now.Before(f.until) {
		return f.until.Sub(now)
	}
	return 0
}

// failed records and logs a failed attempt.
func (a *tokenAuth) failed(r *http.Request, what string) {
	c := client(r)
	a.mu.Lock()
	now := a.now()
	if now.Sub(a.window) >= time.Minute {
		a.window, a.global = now, 0
	}
	a.global++
	f := a.clients[c]
	if f == nil {
		if len(a.clients) >= maxTrackedClients {
			for k, v := range a.clients {
				if now.After(v.until) {
					delete(a.clients, k)
				}
			}
		}
		f = &failures{}
		a.clients[c] = f
	}
	f.n++
	if f.n >= loginFreeFailures {
		f.until = now.Add(min(maxLoginBackoff, time.Second<<min(f.n-loginFreeFailures, 16)))
	}
	n, until := f.n, f.until
	a.mu.Unlock()
	args := []any{"client", c, "failures", n}
	if until.After(now) {
		args = append(args, "refused_until", until.UTC().Format(time.RFC3339))
	}
	a.log.WarnContext(r.Context(), "pgclaim serve: "+what, args...)
}

func (a *tokenAuth) succeeded(r *http.Request) {
	a.mu.Lock()
	delete(a.clients, client(r))
	a.mu.Unlock()
}

// tooMany answers a client that must wait.
func tooMany(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	http.Error(w, fmt.Sprintf("too many failed logins: try again in %v", d.Round(time.Second)), http.StatusTooManyRequests)
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgclaim · log in</title>
<style>body{font:14px system-ui,sans-serif;margin:3em}input{font:inherit}</style></head>
<body><h1>pgclaim status: log in to act</h1>
{{if .}}<p id="login-error" style="color:#a4161a">{{.}}</p>{{end}}
<form method="post" action="login"><label>Action token <input type="password" name="token" autofocus required></label> <button>Log in</button></form>
<p><a href="./">Back to the page</a> (read-only without logging in)</p></body></html>`))

// ServeHTTP serves /login and /logout, and lets POSTs through only from a
// logged-in session or with "Authorization: Bearer TOKEN". GETs pass (the
// page is read-only to them); a logged-in request carries its actor.
func (a *tokenAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/login":
		a.login(w, r)
		return
	case "/logout":
		a.logout(w, r)
		return
	}
	if id, _, ok := a.session(r); ok {
		a.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, fmt.Sprintf("action token (session %s, %s)", id[:8], client(r)))))
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		a.next.ServeHTTP(w, r)
		return
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if d := a.wait(client(r)); d > 0 {
			tooMany(w, d)
			return
		}
		if a.match(bearer) {
			a.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, "action token (bearer, "+client(r)+")")))
			return
		}
		a.failed(r, "wrong bearer token")
	}
	http.Error(w, "refused: log in at /login with the action token first", http.StatusUnauthorized)
}

func (a *tokenAuth) login(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	if r.Method != http.MethodPost {
		_ = loginPage.Execute(w, "")
		return
	}
	if err := a.cop.Check(r); err != nil {
		http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
		return
	}
	if d := a.wait(client(r)); d > 0 {
		tooMany(w, d)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "the login form is too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "bad login form", http.StatusBadRequest)
		return
	}
	if !a.match(r.PostFormValue("token")) {
		a.failed(r, "failed login")
		w.WriteHeader(http.StatusForbidden)
		_ = loginPage.Execute(w, "wrong token")
		return
	}
	a.succeeded(r)
	val, id, exp := a.newSession()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: val, Path: "/", Expires: exp, MaxAge: int(a.ttl.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	a.log.InfoContext(r.Context(), "pgclaim serve: logged in", "client", client(r), "session", id[:8], "expires", exp.UTC().Format(time.RFC3339))
	w.Header().Set("Location", "./")
	w.WriteHeader(http.StatusSeeOther)
}

func (a *tokenAuth) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed: log out with a POST", http.StatusMethodNotAllowed)
		return
	}
	if err := a.cop.Check(r); err != nil {
		http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
		return
	}
	if id, exp, ok := a.session(r); ok {
		a.mu.Lock()
		now := a.now()
		for k, e := range a.revoked {
			if !now.Before(e) {
				delete(a.revoked, k)
			}
		}
		a.revoked[id] = exp
		a.mu.Unlock()
		a.log.InfoContext(r.Context(), "pgclaim serve: logged out", "client", client(r), "session", id[:8])
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.Header().Set("Location", "./")
	w.WriteHeader(http.StatusSeeOther)
}
