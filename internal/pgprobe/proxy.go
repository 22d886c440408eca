package pgprobe

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ProxyConfig returns a copy of pool's config that connects through a
// proxy to the same server, for the rest of the test. With rewritePID the
// proxy changes the backend pid announced in BackendKeyData the way a
// connection pooler does. While *silent is true (silent may be nil) it
// forwards nothing, like a network that went quiet: connections stay open,
// and closing one side still closes the other.
func ProxyConfig(t testing.TB, pool *pgxpool.Pool, rewritePID bool, silent *atomic.Bool) *pgxpool.Config {
	t.Helper()
	cfg, _ := proxied(t, pool, rewritePID, silent, false)
	return cfg
}

// proxied returns a copy of pool's config that connects through a proxy
// (startProxy) to the same server, and the proxy's cut.
func proxied(t testing.TB, pool *pgxpool.Pool, rewritePID bool, silent *atomic.Bool, holdPeer bool) (*pgxpool.Config, func()) {
	t.Helper()
	cfg := pool.Config().Copy()
	network, addr := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		network, addr = "unix", cfg.ConnConfig.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.ConnConfig.Port))
	}
	listen, cut := startProxy(t, network, addr, rewritePID, silent, holdPeer)
	host, port, _ := net.SplitHostPort(listen)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	return cfg, cut
}

// Blackhole is a network between a pool and the server that can go
// silent for good in both directions, like a host that vanished: after
// Silence no byte passes, connections stay open on both sides, a socket the
// client closes is not closed towards the server (the server learns of
// nothing: a test ends the server's sessions itself, as its TCP keepalive
// would), and new connections are accepted but never answered.
type Blackhole struct {
	silent atomic.Bool
	cut    func() // closes every connection through it
}

// BlackholeConfig returns a copy of pool's config that connects through a
// Blackhole to the same server, for the rest of the test.
func BlackholeConfig(t testing.TB, pool *pgxpool.Pool) (*pgxpool.Config, *Blackhole) {
	t.Helper()
	b := &Blackhole{}
	cfg, cut := proxied(t, pool, false, &b.silent, true)
	b.cut = cut
	return cfg, b
}

// Silence stops all forwarding.
func (b *Blackhole) Silence() { b.silent.Store(true) }

// Cut closes every connection through the blackhole on both sides, as a
// network that comes back after both ends gave up would reset them: what
// still waits on one fails at once. Tests call it before closing the pool.
func (b *Blackhole) Cut() { b.cut() }

// startProxy forwards connections to the server at target (see
// ProxyConfig) and returns the address it listens on, and a function that
// closes every connection through it (and those accepted later). With
// holdPeer, a side that ends while silent does not close the other one.
func startProxy(t testing.TB, network, target string, rewritePID bool, silent *atomic.Bool, holdPeer bool) (string, func()) {
	t.Helper()
	if silent == nil {
		silent = new(atomic.Bool)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	cut := false
	cutAll := func() {
		mu.Lock()
		cut = true
		all := open
		open = nil
		mu.Unlock()
		for _, c := range all {
			c.Close()
		}
	}
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial(network, target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			mu.Lock()
			open = append(open, c, s)
			gone := cut
			mu.Unlock()
			if gone {
				c.Close()
				s.Close()
			}
			wg.Add(2)
			closePeer := func(peer net.Conn) {
				if !holdPeer || !silent.Load() {
					peer.Close()
				}
			}
			go func() { defer wg.Done(); forward(s, c, false, silent); closePeer(s) }()
			go func() { defer wg.Done(); forward(c, s, rewritePID, silent); closePeer(c) }()
		}
	}()
	return ln.Addr().String(), cutAll
}

// forward copies protocol messages from src to dst, dropping them while
// silent. With rewritePID (server to client) it flips bit 30 of the pid in
// BackendKeyData ('K'). The client's first message (startup) has no type
// byte; it is forwarded as is.
func forward(dst io.Writer, src io.Reader, rewritePID bool, silent *atomic.Bool) {
	if !rewritePID {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !silent.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(src, header); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(header[1:])-4)
		if _, err := io.ReadFull(src, body); err != nil {
			return
		}
		if header[0] == 'K' && len(body) >= 4 {
			binary.BigEndian.PutUint32(body, binary.BigEndian.Uint32(body)^1<<30)
		}
		if silent.Load() {
			continue
		}
		if _, err := dst.Write(append(header, body...)); err != nil {
			return
		}
	}
}
