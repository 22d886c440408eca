package main

// The limit on failed logins to "pgclaim serve": each client's failures
// and wait, and those of all clients in a minute.

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

type failures struct {
	n     int
	last  time.Time // of the latest failure
	until time.Time // refused until then
}

// bucket is the key of a client's failures: an IPv6 client's /64, since
// one host commonly holds all of it.
func bucket(c string) string {
	if addr, err := netip.ParseAddr(c); err == nil && addr.Is6() {
		return netip.PrefixFrom(addr, 64).Masked().String()
	}
	return c
}

// wait says how long the client must wait before trying again (0: not).
func (a *tokenAuth) wait(c string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	f := a.clients[bucket(c)]
	if f == nil || now.Sub(f.last) >= forgetFailures {
		return 0 // a client that has not failed is never refused
	}
	var d time.Duration
	if now.Before(f.until) {
		d = f.until.Sub(now)
	}
	if now.Sub(a.window) < time.Minute && a.global >= globalFailuresPerMinute {
		d = max(d, a.window.Add(time.Minute).Sub(now))
	}
	return d
}

// failed records and logs a failed attempt.
func (a *tokenAuth) failed(r *http.Request, what string) {
	c := a.client(r)
	a.mu.Lock()
	now := a.now()
	if now.Sub(a.window) >= time.Minute {
		a.window, a.global = now, 0
	}
	a.global++
	f := a.clients[bucket(c)]
	if f != nil && now.Sub(f.last) >= forgetFailures {
		*f = failures{}
	}
	if f == nil {
		a.makeRoom(now)
		f = &failures{}
		a.clients[bucket(c)] = f
	}
	f.n++
	f.last = now
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

// makeRoom keeps the clients tracked under maxTrackedClients: it forgets
// those no longer refused, and then the one whose latest failure is the
// oldest. a.mu is held.
func (a *tokenAuth) makeRoom(now time.Time) {
	if len(a.clients) < maxTrackedClients {
		return
	}
	for k, v := range a.clients {
		if !now.Before(v.until) && (v.n < loginFreeFailures || now.Sub(v.last) >= forgetFailures) {
			delete(a.clients, k)
		}
	}
	for len(a.clients) >= maxTrackedClients {
		oldest := ""
		for k, v := range a.clients {
			if oldest == "" || v.last.Before(a.clients[oldest].last) {
				oldest = k
			}
		}
		delete(a.clients, oldest)
	}
}

func (a *tokenAuth) succeeded(r *http.Request) {
	a.mu.Lock()
	delete(a.clients, bucket(a.client(r)))
	a.mu.Unlock()
}

// tooMany answers a client that must wait.
func tooMany(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	http.Error(w, fmt.Sprintf("too many failed logins: try again in %v", d.Round(time.Second)), http.StatusTooManyRequests)
}
