package pgprobe

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"slices"
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
	cfg, _ := proxied(t, pool, proxyOpts{rewritePID: rewritePID, silent: silent})
	return cfg
}

// proxyOpts are the ways a test proxy departs from plain forwarding.
type proxyOpts struct {
	rewritePID bool         // change the pid in BackendKeyData, as a pooler does
	silent     *atomic.Bool // forward nothing while true
	holdPeer   bool         // a side that ends while silent does not close the other
	stall      *Stall       // hold back the answers to one statement
}

// proxied returns a copy of pool's config that connects through a proxy
// (startProxy) to the same server, and the proxy's cut.
func proxied(t testing.TB, pool *pgxpool.Pool, o proxyOpts) (*pgxpool.Config, func()) {
	t.Helper()
	cfg := pool.Config().Copy()
	network, addr := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		network, addr = "unix", cfg.ConnConfig.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.ConnConfig.Port))
	}
	listen, cut := startProxy(t, network, addr, o)
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
	cfg, cut := proxied(t, pool, proxyOpts{silent: &b.silent, holdPeer: true})
	b.cut = cut
	return cfg, b
}

// Silence stops all forwarding.
func (b *Blackhole) Silence() { b.silent.Store(true) }

// Cut closes every connection through the blackhole on both sides, as a
// network that comes back after both ends gave up would reset them: what
// still waits on one fails at once. Tests call it before closing the pool.
func (b *Blackhole) Cut() { b.cut() }

// Stall is a network between a pool and the server that holds back the
// server's answer to one statement, as a slow network or a loaded client
// would: the first time a client sends the execution of a statement whose
// text contains the string given to StallConfig, the server runs it (and,
// outside a transaction, commits it), but nothing more from the server
// reaches that client until Release. Other connections, and that one once
// released, forward as usual.
type Stall struct {
	match   []byte
	once    sync.Once
	stalled chan struct{}
	release chan struct{}
	relOnce sync.Once
}

// StallConfig returns a copy of pool's config that connects through a
// Stall to the same server, for the rest of the test, holding back the
// answer to the first execution of a statement containing match.
func StallConfig(t testing.TB, pool *pgxpool.Pool, match string) (*pgxpool.Config, *Stall) {
	t.Helper()
	s := &Stall{match: []byte(match), stalled: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(s.Release)
	cfg, _ := proxied(t, pool, proxyOpts{stall: s})
	return cfg, s
}

// Stalled is closed once the statement was sent on to the server and its
// answer is being held back.
func (s *Stall) Stalled() <-chan struct{} { return s.stalled }

// Release lets the held-back answer, and all that follows it, through.
func (s *Stall) Release() { s.relOnce.Do(func() { close(s.release) }) }

// startProxy forwards connections to the server at target (see
// ProxyConfig) and returns the address it listens on, and a function that
// closes every connection through it (and those accepted later). With
// holdPeer, a side that ends while silent does not close the other one.
func startProxy(t testing.TB, network, target string, o proxyOpts) (string, func()) {
	t.Helper()
	silent := o.silent
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
				if !o.holdPeer || !silent.Load() {
					peer.Close()
				}
			}
			if o.stall != nil {
				held := make(chan struct{}) // closed once this connection's answers are held back
				go func() { defer wg.Done(); o.stall.toServer(s, c, held); s.Close() }()
				go func() { defer wg.Done(); o.stall.toClient(c, s, held); c.Close() }()
				continue
			}
			go func() { defer wg.Done(); forward(s, c, false, silent); closePeer(s) }()
			go func() { defer wg.Done(); forward(c, s, o.rewritePID, silent); closePeer(c) }()
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
	for {
		header, body, err := readMessage(src)
		if err != nil {
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

// toServer forwards a client's messages to the server. Once it has seen the
// statement (Parse with its text, then a Bind of that statement), it closes
// held before it forwards the Sync that makes the server answer, and the
// Stalled channel after.
func (st *Stall) toServer(dst io.Writer, src io.Reader, held chan struct{}) {
	// The startup message (or a cancel request) has no type byte.
	n, startup, err := readBody(src, make([]byte, 4))
	if err != nil {
		return
	}
	if _, err := dst.Write(append(n, startup...)); err != nil {
		return
	}
	var names []string // statements whose text matches
	bound, armed := false, false
	for {
		header, body, err := readMessage(src)
		if err != nil {
			return
		}
		switch header[0] {
		case 'P': // Parse: statement name, text, ...
			if name, rest, ok := bytes.Cut(body, []byte{0}); ok && bytes.Contains(rest, st.match) {
				names = append(names, string(name))
			}
		case 'B': // Bind: portal name, statement name, ...
			if _, rest, ok := bytes.Cut(body, []byte{0}); ok {
				if name, _, ok := bytes.Cut(rest, []byte{0}); ok && slices.Contains(names, string(name)) {
					bound = true
				}
			}
		case 'S': // Sync: the server answers now
			if bound { // only the first such execution, on any connection, stalls
				st.once.Do(func() { armed = true; close(held) })
			}
			bound = false
		}
		if _, err := dst.Write(append(header, body...)); err != nil {
			return
		}
		if armed { // the Sync that armed the stall has gone to the server
			armed = false
			close(st.stalled)
		}
	}
}

// toClient forwards the server's messages to a client, waiting for Release
// once held is closed.
func (st *Stall) toClient(dst io.Writer, src io.Reader, held chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-held:
				<-st.release
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readMessage reads one protocol message: its type byte and length, then
// its body.
func readMessage(src io.Reader) (header, body []byte, err error) {
	return readBody(src, make([]byte, 5))
}

// readBody fills header, whose last four bytes are a message's length, and
// reads the body that follows.
func readBody(src io.Reader, header []byte) ([]byte, []byte, error) {
	if _, err := io.ReadFull(src, header); err != nil {
		return nil, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(header[len(header)-4:])-4)
	if _, err := io.ReadFull(src, body); err != nil {
		return nil, nil, err
	}
	return header, body, nil
}
