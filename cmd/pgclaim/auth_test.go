package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

const testToken = "correct-horse-battery-staple"

// loginAs posts a login with tok from the client at addr (with the
// headers given, name then value) and returns the status code.
func loginAs(a http.Handler, addr, tok string, headers ...string) int {
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.RemoteAddr = addr
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	return w.Code
}

// TestLoginLimitPerClient: many clients failing do not lock out one that
// has not failed.
func TestLoginLimitPerClient(t *testing.T) {
	a := newTokenAuth(authConfig{Token: testToken, TTL: time.Hour}, slog.New(slog.DiscardHandler), http.NotFoundHandler())
	for i := range 2 * globalFailuresPerMinute {
		addr := "198.51.100." + strconv.Itoa(i+1) + ":4000"
		if code := loginAs(a, addr, "guess-guess-guess-guess"); code != http.StatusForbidden && code != http.StatusTooManyRequests {
			t.Fatalf("failed login from %s: %d", addr, code)
		}
	}
	if code := loginAs(a, "203.0.113.7:5000", testToken); code != http.StatusSeeOther {
		t.Fatalf("a client that never failed, with the right token, after others failed: %d, want 303", code)
	}
}

// failUntilRefused fails logins from addr (with headers) until refused and
// returns how many failed first.
func failUntilRefused(t *testing.T, a http.Handler, addr string, headers ...string) int {
	t.Helper()
	for i := range 3 * loginFreeFailures {
		switch code := loginAs(a, addr, "guess-guess-guess-guess", headers...); code {
		case http.StatusForbidden:
		case http.StatusTooManyRequests:
			return i
		default:
			t.Fatalf("failed login %d from %s: %d", i+1, addr, code)
		}
	}
	t.Fatalf("%s was never refused", addr)
	return 0
}

// TestLoginLimitBehindProxy: behind a trusted proxy each client has its own
// failures; the forwarded header of an untrusted peer is not believed.
func TestLoginLimitBehindProxy(t *testing.T) {
	const proxy = "10.1.2.3:40000"
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	t.Run("untrusted", func(t *testing.T) {
		a := newTokenAuth(authConfig{Token: testToken, TTL: time.Hour}, log, http.NotFoundHandler())
		for i := range loginFreeFailures {
			if code := loginAs(a, proxy, "guess-guess-guess-guess", "X-Forwarded-For", "203.0.113."+strconv.Itoa(i)); code != http.StatusForbidden {
				t.Fatalf("failure %d: %d", i+1, code)
			}
		}
		// Another X-Forwarded-For does not make a new client.
		if code := loginAs(a, proxy, testToken, "X-Forwarded-For", "203.0.113.99"); code != http.StatusTooManyRequests {
			t.Fatalf("the right token from the refused peer with a new X-Forwarded-For: %d, want 429", code)
		}
		wantContains(t, "log", logs.String(), "not a --trusted-proxy", "peer=10.1.2.3")
	})
	for _, c := range []struct {
		name, header                 string
		mallory, alice, spoofMallory string
	}{
		{"X-Forwarded-For", "", "198.51.100.1", "198.51.100.2", "192.0.2.9, 198.51.100.1"},
		{"X-Forwarded-For", "X-Forwarded-For", "[2001:db8::1]:1234", "2001:db8:1::1", "2001:db8::2"},
		{"Forwarded", "Forwarded", `for=198.51.100.1;proto=https`, `for="198.51.100.2:80"`, `for=192.0.2.9, for=198.51.100.1`},
	} {
		t.Run(c.name+" "+c.header, func(t *testing.T) {
			a := newTokenAuth(authConfig{Token: testToken, TTL: time.Hour, ClientHeader: c.header,
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, log, http.NotFoundHandler())
			h := c.name
			if n := failUntilRefused(t, a, proxy, h, c.mallory); n != loginFreeFailures {
				t.Fatalf("refused after %d failures, want %d", n, loginFreeFailures)
			}
			// Mallory prepending another address is still Mallory (or, for
			// IPv6, within the same /64).
			if code := loginAs(a, proxy, testToken, h, c.spoofMallory); code != http.StatusTooManyRequests {
				t.Fatalf("mallory with a prepended address: %d, want 429", code)
			}
			if code := loginAs(a, proxy, testToken, h, c.alice); code != http.StatusSeeOther {
				t.Fatalf("alice through the same proxy: %d, want 303", code)
			}
		})
	}
	t.Run("chain", func(t *testing.T) {
		a := newTokenAuth(authConfig{Token: testToken, TTL: time.Hour,
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12")}}, log, http.NotFoundHandler())
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = proxy
		r.Header.Add("X-Forwarded-For", "192.0.2.1, 198.51.100.7")
		r.Header.Add("X-Forwarded-For", "172.16.0.5")
		if got := a.client(r); got != "198.51.100.7" {
			t.Errorf("client through two trusted proxies = %s, want 198.51.100.7", got)
		}
		r.Header.Set("X-Forwarded-For", "garbage, 172.16.0.5")
		if got := a.client(r); got != "172.16.0.5" {
			t.Errorf("client of an unparsable hop = %s, want the proxy that wrote it", got)
		}
		r.Header.Set("X-Forwarded-Proto", "https")
		if !a.secure(r) {
			t.Error("X-Forwarded-Proto https from a trusted proxy: the cookie is not Secure")
		}
		r.RemoteAddr = "192.0.2.50:1"
		if a.secure(r) || a.client(r) != "192.0.2.50" {
			t.Error("an untrusted peer's headers were believed")
		}
	})
}

// TestLoginLimitBounded: the clients remembered stay bounded, and a client
// that never failed gets in while many others fail.
func TestLoginLimitBounded(t *testing.T) {
	a := newTokenAuth(authConfig{Token: testToken, TTL: time.Hour}, slog.New(slog.DiscardHandler), http.NotFoundHandler())
	for i := range maxTrackedClients + 500 {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String() + ":1"
		for range loginFreeFailures {
			loginAs(a, addr, "guess-guess-guess-guess")
		}
	}
	if n := len(a.clients); n > maxTrackedClients {
		t.Errorf("%d clients remembered, want at most %d", n, maxTrackedClients)
	}
	if code := loginAs(a, "192.0.2.1:1", testToken); code != http.StatusSeeOther {
		t.Errorf("a fresh client after %d others failed: %d, want 303", maxTrackedClients+500, code)
	}
	// A client that failed once waits while all clients together fail too often.
	if code := loginAs(a, "192.0.2.2:1", "guess-guess-guess-guess"); code != http.StatusForbidden {
		t.Fatalf("first failure: %d", code)
	}
	if code := loginAs(a, "192.0.2.2:1", testToken); code != http.StatusTooManyRequests {
		t.Errorf("a client that failed, past the global limit: %d, want 429", code)
	}
}
