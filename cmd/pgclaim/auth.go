package main

import (
	"context"
	"crypto/hkdf"
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
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Action tokens and sessions of "pgclaim serve".
//
// The token is checked for strength at start-up (checkSecret) and compared
// by its SHA-256 digest in constant time, so neither its content nor its
// length leaks through timing. Logging in with it at /login sets a session
// cookie that is not the token: a random session id and an expiry, signed
// (HMAC-SHA256) with a key derived (HKDF-SHA256, a fixed label) from the
// session key, or from the action token when no session key is given. Every
// replica given the same secret verifies every other's sessions, and a
// session outlives restarts until it expires or is logged out (on the
// replica that served /logout); changing the secret ends them all.
//
// Failed logins (and POSTs with a wrong bearer token) are logged with the
// client's address and limited per client: after loginFreeFailures
// failures a client waits, doubling up to maxLoginBackoff. Past
// globalFailuresPerMinute failures a minute of all clients together, a
// client that has failed at all waits for the minute's end; a client that
// has not failed is never refused, so no client locks out another. The
// client is the peer's address, or, when the peer is a trusted proxy, the
// nearest address in the forwarded header that is not one (an IPv6 client
// is limited by its /64).

const (
	// sessionCookie carries a logged-in operator's signed session.
	sessionCookie = "pgclaim_session"
	// sessionKeyLabel is the HKDF info of the session signing key: the key
	// is never the secret itself.
	sessionKeyLabel = "pgclaim serve: session signing key v1"
	// minTokenBits is the least strength an action token must show.
	minTokenBits = 64
	// loginFreeFailures is how many failed logins a client has before it
	// must wait.
	loginFreeFailures = 5
	// maxLoginBackoff bounds a client's wait after failed logins.
	maxLoginBackoff = 5 * time.Minute
	// forgetFailures is how long after its last failure a client's
	// failures are forgotten.
	forgetFailures = time.Hour
	// globalFailuresPerMinute is the failed logins of all clients a minute
	// past which any client that has failed waits for the minute's end.
	globalFailuresPerMinute = 30
	// maxLoginBody bounds the login form.
	maxLoginBody = 4 << 10
	// maxTrackedClients bounds the clients whose failures are remembered.
	maxTrackedClients = 10_000
)

// checkSecret refuses a secret (what names it) that is short, a
// repetition, or of too few distinct characters: its strength is
// estimated as its length times log2 of its number of distinct characters.
func checkSecret(what, tok string) error {
	const hint = "use at least 16 random characters, for example the output of 'openssl rand -hex 16'"
	if len(tok) < 16 {
		return fmt.Errorf("the %s is %d characters long: %s", what, len(tok), hint)
	}
	for p := 1; p <= len(tok)/2; p++ {
		if len(tok)%p == 0 && strings.Repeat(tok[:p], len(tok)/p) == tok {
			return fmt.Errorf("the %s repeats %q: %s", what, tok[:p], hint)
		}
	}
	distinct := map[rune]bool{}
	for _, r := range tok {
		distinct[r] = true
	}
	if bits := float64(len([]rune(tok))) * math.Log2(float64(len(distinct))); bits < minTokenBits {
		return fmt.Errorf("the %s is too weak (%d distinct characters in %d): %s", what, len(distinct), len(tok), hint)
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

// authConfig configures tokenAuth.
type authConfig struct {
	Token string // the action token
	// SessionKey signs sessions; empty: the action token does.
	SessionKey string
	TTL        time.Duration // of a session
	// TrustedProxies are the peers whose ClientHeader names the client;
	// none: the peer is the client.
	TrustedProxies []netip.Prefix
	// ClientHeader is X-Forwarded-For (empty too) or Forwarded.
	ClientHeader string
}

// tokenAuth authenticates the actions of "pgclaim serve".
type tokenAuth struct {
	digest  [sha256.Size]byte // of the action token
	key     []byte            // signs sessions
	ttl     time.Duration
	proxies []netip.Prefix
	header  string // canonical: X-Forwarded-For or Forwarded
	log     *slog.Logger
	now     func() time.Time
	cop     *http.CrossOriginProtection
	next    http.Handler
	untrust sync.Once // warns of a forwarded header from an untrusted peer
	mu      sync.Mutex
	revoked map[string]time.Time // session id -> its expiry
	clients map[string]*failures // by client (an IPv6 one by its /64)
	window  time.Time            // start of the global minute
	global  int                  // failures in it
}

func newTokenAuth(cfg authConfig, log *slog.Logger, next http.Handler) *tokenAuth {
	secret := cfg.SessionKey
	if secret == "" {
		secret = cfg.Token
	}
	key, err := hkdf.Key(sha256.New, []byte(secret), nil, sessionKeyLabel, sha256.Size)
	if err != nil {
		panic(err) // only for lengths past 255 hashes
	}
	header := http.CanonicalHeaderKey(cfg.ClientHeader)
	if header == "" {
		header = "X-Forwarded-For"
	}
	return &tokenAuth{
		digest: sha256.Sum256([]byte(cfg.Token)), key: key, ttl: cfg.TTL, proxies: cfg.TrustedProxies, header: header,
		log: log, now: time.Now, cop: http.NewCrossOriginProtection(), next: next,
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
	if err != nil || !a.now().Before(exp) || len(id) < 8 {
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
		a.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, fmt.Sprintf("action token (session %s, %s)", id[:8], a.client(r)))))
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		a.next.ServeHTTP(w, r)
		return
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if d := a.wait(a.client(r)); d > 0 {
			tooMany(w, d)
			return
		}
		if a.match(bearer) {
			a.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, "action token (bearer, "+a.client(r)+")")))
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
	if d := a.wait(a.client(r)); d > 0 {
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
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.secure(r)})
	a.log.InfoContext(r.Context(), "pgclaim serve: logged in", "client", a.client(r), "session", id[:8], "expires", exp.UTC().Format(time.RFC3339))
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
		a.log.InfoContext(r.Context(), "pgclaim serve: logged out", "client", a.client(r), "session", id[:8])
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.secure(r)})
	w.Header().Set("Location", "./")
	w.WriteHeader(http.StatusSeeOther)
}
