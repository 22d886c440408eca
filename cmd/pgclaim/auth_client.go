package main

// The client of a request to "pgclaim serve": its address behind trusted
// proxies, and whether it came over HTTPS.

import (
	"net/http"
	"net/netip"
	"strings"
)

// trusted says whether addr is a trusted proxy.
func (a *tokenAuth) trusted(addr netip.Addr) bool {
	for _, p := range a.proxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// peer returns the address of the request's peer.
func peer(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// client names the request's client for the limits and the log: the peer,
// or, when the peer is a trusted proxy, the nearest address of the
// forwarded header that is not a trusted proxy (read right to left, as
// each proxy appends its peer; a hop it cannot parse ends the walk at the
// proxy that wrote it).
func (a *tokenAuth) client(r *http.Request) string {
	addr, ok := peer(r)
	if !ok {
		return r.RemoteAddr
	}
	if !a.trusted(addr) {
		if r.Header.Get(a.header) != "" {
			a.untrust.Do(func() {
				a.log.WarnContext(r.Context(), "pgclaim serve: requests carry "+a.header+" from a peer that is not a --trusted-proxy: the login limit counts all its clients as one; if it is your proxy, name it with --trusted-proxy", "peer", addr.String())
			})
		}
		return addr.String()
	}
	hops := forwardedFor(r.Header.Values(a.header), a.header == "Forwarded")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHop(hops[i])
		if !ok {
			break
		}
		addr = hop
		if !a.trusted(hop) {
			break
		}
	}
	return addr.String()
}

// forwardedFor returns the client addresses of X-Forwarded-For, or of
// Forwarded's for= parameters, the first proxy's first.
func forwardedFor(values []string, forwarded bool) []string {
	var hops []string
	for _, v := range values {
		for _, elem := range strings.Split(v, ",") {
			elem = strings.TrimSpace(elem)
			if !forwarded {
				hops = append(hops, elem)
				continue
			}
			hop := "" // an element without for= names no client: unparsable
			for _, pair := range strings.Split(elem, ";") {
				if k, val, ok := strings.Cut(strings.TrimSpace(pair), "="); ok && strings.EqualFold(k, "for") {
					hop = strings.Trim(val, `"`)
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// parseHop parses a forwarded address: IP, IP:PORT, [IPv6] or [IPv6]:PORT.
func parseHop(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	addr, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// secure says whether the client reached serve over HTTPS: directly, or
// through a trusted proxy that says so (X-Forwarded-Proto, or Forwarded's
// proto=).
func (a *tokenAuth) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if addr, ok := peer(r); !ok || !a.trusted(addr) {
		return false
	}
	if a.header == "Forwarded" {
		return strings.Contains(strings.ToLower(r.Header.Get("Forwarded")), "proto=https")
	}
	return strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}
