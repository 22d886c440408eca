package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// findBinDir locates a directory holding initdb and postgres: dir if given,
// else the one PGCLAIM_TEST_PG_BIN names, else PATH, else
// `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin.
func findBinDir(dir string) (string, error) {
	has := func(d string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("no initdb and postgres in %s", dir)
	}
	if dir = os.Getenv(EnvBin); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%s=%s: no initdb and postgres there", EnvBin, dir)
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { // newest major version first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(matches[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(matches[j])))
		return vi > vj
	})
	for _, d := range matches {
		if has(d) {
			return d, nil
		}
	}
	return "", errors.New("initdb and postgres not found on PATH, via pg_config, or under /usr/lib/postgresql/*/bin")
}

// localCluster is a PostgreSQL cluster pgtest initialised and runs.
type localCluster struct {
	binDir string
	dir    string // holds data/ and the log; removed on close
	port   int
	cred   *syscall.Credential // nil unless running as root
	// settings are extra "name=value" server settings, after pgtest's own.
	settings []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
	err  error         // cmd's exit error, valid once done is closed
}

// reaperPipes keeps the write ends of the reapers' stdin pipes open for the
// life of the process: when the process exits, however it exits, the pipes
// close and each reaper stops its cluster and removes its files.
var (
	reaperMu    sync.Mutex
	reaperPipes []*os.File
)

const reaperScript = `read -r _
pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
if [ -n "$pid" ]; then
  kill -QUIT "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL "$pid" 2>/dev/null
fi
rm -rf "$1"
`

func startLocal(ctx context.Context, binDir string, settings []string) (*Server, error) {
	c, err := newLocalCluster(binDir)
	if err != nil {
		return nil, err
	}
	c.settings = settings
	if err := c.initdb(ctx); err != nil {
		return nil, err
	}
	if err := c.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	return &Server{
		source:   SourceLocal,
		adminURL: c.url("postgres"),
		restart:  c.restart,
		close:    c.close,
	}, nil
}

// newLocalCluster prepares a cluster directory (owned by the postgres user
// when running as root) with its clean-up process; nothing runs in it yet.
// An error finding the binaries is returned as it is.
func newLocalCluster(binDir string) (*localCluster, error) {
	bin, err := findBinDir(binDir)
	if err != nil {
		return nil, err
	}
	c := &localCluster{binDir: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("running as root and there is no postgres user to run the server as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	c.dir, err = os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			_ = os.RemoveAll(c.dir)
			return nil, err
		}
	}
	if err := c.startReaper(); err != nil {
		_ = os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

// startOnFreePort starts the server on a free loopback port, trying again
// with another port when one was taken meanwhile.
func (c *localCluster) startOnFreePort(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if c.port, lastErr = freePort(); lastErr != nil {
			continue
		}
		if lastErr = c.start(ctx); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

func (c *localCluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

func (c *localCluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.Dir = c.dir
	// Own process group: a Ctrl-C aimed at the test run does not reach the
	// server before pgtest's own clean-up does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd
}

func (c *localCluster) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "pgtest-reaper", c.dir)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start clean-up process: %w", err)
	}
	r.Close()
	go func() { _ = cmd.Wait() }()
	reaperMu.Lock()
	reaperPipes = append(reaperPipes, w)
	reaperMu.Unlock()
	return nil
}

func (c *localCluster) initdb(ctx context.Context) error {
	var out bytes.Buffer
	cmd := c.command(ctx, "initdb", "-D", filepath.Join(c.dir, "data"), "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync") // --no-instructions is 14+
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (c *localCluster) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"-D", filepath.Join(c.dir, "data"),
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + c.dir,
		"-c", "max_connections=500",
		"-c", "shared_buffers=128MB",
		// A throwaway cluster: no need to survive a power cut. Commits still
		// reach the operating system before they are acknowledged
		// (synchronous_commit stays on), so a Restart loses nothing
		// committed, as with a real server crash.
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_locks_per_transaction=256",
		"-c", "log_min_messages=warning",
	}
	for _, s := range c.settings { // later settings override earlier ones
		args = append(args, "-c", s)
	}
	cmd := c.command(context.Background(), "postgres", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	alive := func() error {
		select {
		case <-done:
			return fmt.Errorf("postgres exited during start-up: %v; log: %s", c.exitErr(), c.logTail())
		default:
			return nil
		}
	}
	if err := waitReady(ctx, c.url("postgres"), alive); err != nil {
		c.stop()
		return err
	}
	return nil
}

func (c *localCluster) exitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *localCluster) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// stop ends the server with an immediate shutdown (SIGQUIT): every backend
// is cut at once and no checkpoint is written, as after a crash.
func (c *localCluster) stop() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// shutdown stops the server cleanly (a fast shutdown, SIGINT: sessions are
// ended and a shutdown checkpoint is written), so its data directory can be
// copied.
func (c *localCluster) shutdown() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("postgres did not shut down within a minute; log: %s", c.logTail())
	}
}

func (c *localCluster) restart(ctx context.Context) error {
	c.stop()
	return c.start(ctx)
}

func (c *localCluster) close() error {
	c.stop()
	return os.RemoveAll(c.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
