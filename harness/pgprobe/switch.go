package pgprobe

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Switch is an address whose server can change, as a writer's DNS name
// points at a reader for a while after a failover: each new connection goes
// to the server it names when the connection arrives; connections made
// before keep theirs.
type Switch struct {
	ln     net.Listener
	target atomic.Value // host:port
}

// SwitchConfig returns a copy of the pool configuration of dsn that
// connects through a Switch, first pointing at dsn's server, for the rest
// of the test.
func SwitchConfig(t testing.TB, dsn string) (*pgxpool.Config, *Switch) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Switch{ln: ln}
	s.Point(t, dsn)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			srv, err := net.Dial("tcp", s.target.Load().(string))
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, srv)
			mu.Unlock()
			for _, p := range [][2]net.Conn{{c, srv}, {srv, c}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = io.Copy(p[0], p[1])
					_ = p[0].Close()
					_ = p[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil
	return cfg, s
}

// Point makes new connections go to the server of dsn.
func (s *Switch) Point(t testing.TB, dsn string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	s.target.Store(u.Host)
}
