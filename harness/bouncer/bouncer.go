package bouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned when the pgbouncer binary cannot be found.
var ErrNotFound = errors.New("bouncer: pgbouncer not found (apt-get install pgbouncer, or set PGBOUNCER)")

// Bouncer is a PgBouncer in transaction pooling mode started on loopback in
// front of one database.
type Bouncer struct {
	dir     string
	port    int
	bin     string
	iniPath string
	cred    *syscall.Credential

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	stopping bool     // kill or stop was called: an exit is expected
	crashed  bool     // exited unexpectedly, and was not restarted
	known    []string // exits on PgBouncer's known bug, each restarted (log lines)
	logFrom  int64    // the log's size when the current process started
}

// knownCrash matches the log line of PgBouncer aborting on one of its own
// internal state checks ("FATAL @src/FILE:LINE in function F(): ... bad ...
// state: N"): bugs of PgBouncer, not of its clients. Debian 12 ships 1.18,
// which the chaos faults (a Postgres restart, or a backend terminated, while
// a client's cancel request is on its way) bring to two of them:
// "server_proto: server in bad state: 11" (pgbouncer/pgbouncer#822, fixed
// in 1.21 by pull request #927) and "disconnect_client(): bad client state:
// 0" (pgbouncer/pgbouncer#801, open).
var knownCrash = regexp.MustCompile(`FATAL @src/\S+ in function \w+\(\): .*bad (\w+ )?state: \d+`)

// Find returns the pgbouncer binary: $PGBOUNCER, PATH, or the
// Debian location.
func Find() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNotFound
}

// Start starts PgBouncer in front of database dbName of the server
// whose connection string is serverURL. As root it runs as the postgres
// user, since PgBouncer refuses to run as root.
func Start(ctx context.Context, serverURL, dbName string) (*Bouncer, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, err
	}
	host, port := u.Hostname(), u.Port()
	userName := u.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	cred, err := PostgresCred("pgbouncer")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{dir: dir, bin: bin, cred: cred}
	fail := func(err error) (*Bouncer, error) {
		b.Stop()
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q \"\"\n", userName)), 0o644); err != nil {
		return fail(err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		if b.port, err = FreePort(); err != nil {
			continue
		}
		ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir = %s
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_login_retry = 1
server_connect_timeout = 5
query_wait_timeout = 30
logfile = %s
pidfile = %s
`, dbName, host, port, dbName, userName, b.port, dir, filepath.Join(dir, "users.txt"),
			filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
		b.iniPath = filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(b.iniPath, []byte(ini), 0o644); err != nil {
			return fail(err)
		}
		if err := b.start(); err != nil {
			return fail(err)
		}
		if err = b.waitReady(ctx, dbName); err == nil {
			return b, nil
		}
		b.Kill()
		b.mu.Lock()
		b.stopping = false
		b.mu.Unlock()
	}
	return fail(fmt.Errorf("bouncer: pgbouncer did not start: %w; log: %s", err, b.LogTail()))
}

// start starts the PgBouncer process on b's configuration.
func (b *Bouncer) start() error {
	cmd := exec.Command(b.bin, b.iniPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: b.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bouncer: start pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var from int64
	if fi, err := os.Stat(filepath.Join(b.dir, "pgbouncer.log")); err == nil {
		from = fi.Size()
	}
	b.mu.Lock()
	b.cmd, b.done, b.logFrom = cmd, done, from
	b.mu.Unlock()
	return nil
}

// ownLog is what the current process wrote to the log (b.mu held).
func (b *Bouncer) ownLog() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if int64(len(data)) >= b.logFrom {
		data = data[b.logFrom:]
	}
	return string(data)
}

// Supervise watches PgBouncer until ctx ends: an exit on PgBouncer's known
// bugs (knownCrash) is recorded and PgBouncer started again on the same
// port, as a service manager would; any other unexpected exit is left
// for the run's report (exited).
func (b *Bouncer) Supervise(ctx context.Context, logf func(string, ...any)) {
	for {
		b.mu.Lock()
		done := b.done
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-done:
		}
		b.mu.Lock()
		if b.stopping {
			b.mu.Unlock()
			return
		}
		line := lastLineMatching(b.ownLog(), knownCrash)
		if line == "" {
			b.crashed = true
			b.mu.Unlock()
			return
		}
		b.known = append(b.known, line)
		b.mu.Unlock()
		logf("pgbouncer exited on its own state check (%s); starting it again", line)
		for {
			err := b.start()
			if err == nil {
				break
			}
			logf("%v; trying again", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}

// KnownCrashes returns the log lines of the exits on PgBouncer's known bugs.
func (b *Bouncer) KnownCrashes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.known)
}

func lastLineMatching(log string, re *regexp.Regexp) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if re.MatchString(lines[i]) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// URL returns a connection string to dbName through the bouncer, with the
// settings a pgx client needs under transaction pooling.
func (b *Bouncer) URL(dbName, appName string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&application_name=%s&default_query_exec_mode=exec&connect_timeout=5",
		b.port, dbName, appName)
}

func (b *Bouncer) waitReady(ctx context.Context, dbName string) error {
	deadline := time.Now().Add(15 * time.Second)
	var last error
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errors.New("pgbouncer exited")
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, b.URL(dbName, "pgbouncer-ready"))
		if err == nil {
			var one int
			err = conn.QueryRow(cctx, "SELECT 1").Scan(&one)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// LogTail returns the end of PgBouncer's log.
func (b *Bouncer) LogTail() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return strings.TrimSpace(string(data))
}

// Exited reports whether PgBouncer exited unexpectedly (before kill or
// stop) and was not started again (see Supervise).
func (b *Bouncer) Exited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.crashed {
		return true
	}
	if b.done == nil || b.stopping {
		return false
	}
	select {
	case <-b.done:
		// Exited; Supervise (if it runs) has not decided yet, or never will.
		return lastLineMatching(b.ownLog(), knownCrash) == ""
	default:
		return false
	}
}

// Kill stops PgBouncer (SIGTERM, then SIGKILL after 5 s), keeping its files.
func (b *Bouncer) Kill() {
	b.mu.Lock()
	b.stopping = true
	cmd, done := b.cmd, b.done
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Stop stops PgBouncer and removes its files.
func (b *Bouncer) Stop() {
	b.Kill()
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// PostgresCred is the postgres user's credential when this process runs as
// root (PostgreSQL, PgBouncer and Patroni refuse to run as root), else nil.
func PostgresCred(what string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	pu, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("bouncer: running as root and there is no postgres user to run %s as", what)
	}
	uid, _ := strconv.Atoi(pu.Uid)
	gid, _ := strconv.Atoi(pu.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// FreePort returns a TCP port free on loopback now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
