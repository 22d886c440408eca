package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PairConfig configures StartPair.
type PairConfig struct {
	// Synchronous makes every commit on the primary that wrote WAL wait
	// until the standby has flushed it (synchronous_standby_names = '*'),
	// from the moment StartPair returns. While the standby is stopped such
	// commits then wait.
	Synchronous bool
	// BinDir, when set, is the directory holding the PostgreSQL binaries
	// (initdb, postgres, and pg_basebackup if there is one), as in Config:
	// unset, PGCLAIM_TEST_PG_BIN, else a search.
	BinDir string

	noBaseBackup bool // copy the primary as without pg_basebackup (tests)
}

// Pair is a primary and a streaming standby of it: two clusters started
// from local PostgreSQL binaries (as the postgres user when the process is
// root) on free loopback ports, for failover tests. A test writes on the
// primary, stops the standby (StopStandby) so that it misses what the
// primary writes next, kills the primary (KillPrimary) and promotes the
// standby (Promote); clients on URL then reach the promoted standby.
//
// A Pair is removed by Close, or when the test process exits, however it
// exits. Its methods are safe for concurrent use.
type Pair struct {
	primary, standby *localCluster

	mu        sync.Mutex
	standbyUp bool
}

// NewPair starts a Pair for t (see StartPair) and closes it when t ends.
// Without local PostgreSQL binaries the test is skipped, or failed when the
// CI environment variable is "true", as with Shared.
func NewPair(t testing.TB, cfg PairConfig) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := StartPair(ctx, cfg)
	if errors.Is(err, ErrUnavailable) && os.Getenv("CI") != "true" {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return p
}

// StartPair initialises and starts a primary, takes a base backup of it
// with pg_basebackup (-R: the copy starts as a standby streaming from the
// primary), starts the standby and returns once it streams (and, with
// cfg.Synchronous, is the primary's synchronous standby). Where the server
// binaries come without pg_basebackup (server-only builds), the base backup
// is a copy of the primary's data directory taken while it is shut down,
// with the standby's settings written as pg_basebackup -R would. Without
// local binaries the error wraps ErrUnavailable.
func StartPair(ctx context.Context, cfg PairConfig) (*Pair, error) {
	// Two small servers: a failover test needs few connections.
	settings := []string{"max_connections=100", "shared_buffers=32MB", "wal_keep_size=256MB"}
	primary, err := newLocalCluster(cfg.BinDir)
	basebackup := false
	if err == nil && !cfg.noBaseBackup {
		if dir, ok := baseBackupDir(primary.binDir); ok {
			primary.binDir, basebackup = dir, true
		}
	}
	if err != nil {
		if primary != nil {
			_ = primary.close()
		}
		return nil, fmt.Errorf("%w: local binaries: %v", ErrUnavailable, err)
	}
	primary.settings = settings
	p := &Pair{primary: primary}
	fail := func(err error) (*Pair, error) {
		_ = p.Close()
		return nil, fmt.Errorf("pgtest: start pair: %w", err)
	}
	if err := primary.initdb(ctx); err != nil {
		return fail(err)
	}
	if err := primary.startOnFreePort(ctx); err != nil {
		return fail(err)
	}
	if p.standby, err = newLocalCluster(primary.binDir); err != nil {
		return fail(err)
	}
	p.standby.settings = settings
	if basebackup {
		var out bytes.Buffer
		cmd := p.standby.command(ctx, "pg_basebackup", "-D", filepath.Join(p.standby.dir, "data"),
			"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
			"-X", "stream", "-R", "-c", "fast", "--no-sync")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fail(fmt.Errorf("pg_basebackup: %v: %s", err, strings.TrimSpace(out.String())))
		}
	} else if err := p.coldCopy(ctx); err != nil {
		return fail(err)
	}
	if err := p.standby.startOnFreePort(ctx); err != nil {
		return fail(err)
	}
	p.standbyUp = true
	state := "streaming"
	if cfg.Synchronous {
		// Set on the primary only, after the base backup: the standby,
		// once promoted, must not wait for a standby of its own.
		if err := p.primaryExec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
			return fail(err)
		}
		state = "sync"
	}
	if err := p.waitReplication(ctx, state); err != nil {
		return fail(err)
	}
	return p, nil
}

// baseBackupDir returns the directory holding pg_basebackup with the
// postgres binary found in bin: bin itself, or the directory its postgres
// links to (a PATH directory may hold links to initdb and postgres only);
// ok is false when there is none. A pg_basebackup of another version is
// never used: it refuses newer servers.
func baseBackupDir(bin string) (dir string, ok bool) {
	has := func(d string) bool {
		fi, err := os.Stat(filepath.Join(d, "pg_basebackup"))
		return err == nil && !fi.IsDir()
	}
	if has(bin) {
		return bin, true
	}
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "postgres")); err == nil && has(filepath.Dir(real)) {
		return filepath.Dir(real), true
	}
	return "", false
}

// coldCopy makes the standby's data directory without pg_basebackup: it
// shuts the primary down cleanly, copies its data directory, starts it
// again on its port, and writes into the copy what pg_basebackup -R
// writes (standby.signal, and primary_conninfo in postgresql.auto.conf).
// A copy of a cleanly shut down cluster needs no backup label: it starts
// from the shutdown checkpoint and streams the rest.
func (p *Pair) coldCopy(ctx context.Context) error {
	src, dst := filepath.Join(p.primary.dir, "data"), filepath.Join(p.standby.dir, "data")
	if err := p.primary.shutdown(); err != nil {
		return fmt.Errorf("shut the primary down for a copy: %w", err)
	}
	var out bytes.Buffer
	cp := exec.CommandContext(ctx, "cp", "-a", src, dst)
	cp.SysProcAttr = &syscall.SysProcAttr{Credential: p.standby.cred}
	cp.Stdout, cp.Stderr = &out, &out
	if err := cp.Run(); err != nil {
		return fmt.Errorf("copy the primary's data directory: %v: %s", err, strings.TrimSpace(out.String()))
	}
	if err := p.primary.start(ctx); err != nil {
		return fmt.Errorf("restart the primary after the copy: %w", err)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", p.primary.port)
	write := func(name, text string, flag int) error {
		f, err := os.OpenFile(filepath.Join(dst, name), flag|os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		_, err = f.WriteString(text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && p.standby.cred != nil {
			err = os.Chown(filepath.Join(dst, name), int(p.standby.cred.Uid), int(p.standby.cred.Gid))
		}
		return err
	}
	if err := write("standby.signal", "", os.O_TRUNC); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dst, "postmaster.pid"))
	return write("postgresql.auto.conf", "primary_conninfo = '"+conninfo+"'\n", os.O_APPEND)
}

// primaryExec runs statements on the primary's maintenance database.
func (p *Pair) primaryExec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, p.primary.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// waitReplication waits until the primary reports the standby streaming
// (state "streaming") or as its synchronous standby (state "sync").
func (p *Pair) waitReplication(ctx context.Context, state string) error {
	conn, err := pgx.Connect(ctx, p.primary.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	err = poll(ctx, func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE state = 'streaming' AND ($1 <> 'sync' OR sync_state = 'sync')`, state).Scan(&n)
		return n > 0, err
	})
	if err != nil {
		return fmt.Errorf("standby not %s: %w; standby log: %s", state, err, p.standby.logTail())
	}
	return nil
}

// poll calls done every 10 ms until it reports true or an error, for up to
// a minute.
func poll(ctx context.Context, done func() (bool, error)) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := done()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return errors.New("still not so after a minute")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// PrimaryURL returns the connection string of database db on the primary.
func (p *Pair) PrimaryURL(db string) string { return p.primary.url(db) }

// StandbyURL returns the connection string of database db on the standby.
func (p *Pair) StandbyURL(db string) string { return p.standby.url(db) }

// URL returns a connection string of database db naming both servers, with
// target_session_attrs=read-write: a client reaches the primary, and the
// standby once it is promoted, as through a failover manager's multi-host
// URL.
func (p *Pair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		p.primary.port, p.standby.port, db)
}

// WaitReplayed waits until the standby has replayed all WAL the primary had
// flushed when WaitReplayed was called: every commit acknowledged by then
// is on the standby.
func (p *Pair) WaitReplayed(ctx context.Context) error {
	var target string
	if err := queryRow(ctx, p.primary.url("postgres"), "SELECT pg_current_wal_flush_lsn()::text", &target); err != nil {
		return fmt.Errorf("pgtest: wait for replay: %w", err)
	}
	sc, err := pgx.Connect(ctx, p.standby.url("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: wait for replay: %w", err)
	}
	defer sc.Close(context.Background())
	err = poll(ctx, func() (done bool, err error) {
		err = sc.QueryRow(ctx, "SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)", target).Scan(&done)
		return done, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait for the standby to replay %s: %w", target, err)
	}
	return nil
}

// StopStandby stops the standby at once (an immediate shutdown): it
// receives nothing the primary writes from then on. Promote starts it
// again.
func (p *Pair) StopStandby() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.standby.stop()
	p.standbyUp = false
}

// KillPrimary kills every process of the primary's server with SIGKILL,
// as when its host dies: sessions end without a word, nothing is flushed
// or sent to the standby any more. It returns once the postmaster has
// exited.
func (p *Pair) KillPrimary() {
	c := p.primary
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	// The postmaster leads its own process group, which its children
	// inherit.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Promote starts the standby if it is stopped (with the primary gone it
// replays only the WAL it had received) and promotes it; it returns once
// the standby accepts writes, on a new timeline.
func (p *Pair) Promote(ctx context.Context) error {
	p.mu.Lock()
	if !p.standbyUp {
		if err := p.standby.start(ctx); err != nil {
			p.mu.Unlock()
			return fmt.Errorf("pgtest: start standby: %w", err)
		}
		p.standbyUp = true
	}
	p.mu.Unlock()
	var ok bool
	if err := queryRow(ctx, p.standby.url("postgres"), "SELECT pg_promote(true, 60)", &ok); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgtest: promote: not promoted within 60s; log: %s", p.standby.logTail())
	}
	return nil
}

// queryRow runs query on a connection of its own to url and scans its one
// row into dest.
func queryRow(ctx context.Context, url, query string, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, query).Scan(dest...)
}

// Close stops both servers and removes their files.
func (p *Pair) Close() error {
	var errs []error
	for _, c := range []*localCluster{p.primary, p.standby} {
		if c != nil {
			errs = append(errs, c.close())
		}
	}
	return errors.Join(errs...)
}
