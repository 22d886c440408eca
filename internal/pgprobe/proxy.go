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
	cfg := pool.Config().Copy()
	network, addr := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		network, addr = "unix", cfg.ConnConfig.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.ConnConfig.Port))
	}
	host, port, _ := net.SplitHostPort(startProxy(t, network, addr, rewritePID, silent))
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	return cfg
}

// startProxy forwards connections to the server at target (see
// ProxyConfig) and returns the address it listens on.
func startProxy(t testing.TB, network, target string, rewritePID bool, silent *atomic.Bool) string {
	t.Helper()
	if silent == nil {
		silent = new(atomic.Bool)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
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
			wg.Add(2)
			go func() { defer wg.Done(); forward(s, c, false, silent); s.Close() }()
			go func() { defer wg.Done(); forward(c, s, rewritePID, silent); c.Close() }()
		}
	}()
	return ln.Addr().String()
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
