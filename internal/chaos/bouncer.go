package chaos

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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoBouncer is returned when the pgbouncer binary cannot be found.
var ErrNoBouncer = errors.New("chaos: pgbouncer not found (apt-get install pgbouncer, or set PGBOUNCER)")

// bouncer is a PgBouncer in transaction pooling mode started on loopback in
// front of one database.
type bouncer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// findBouncer returns the pgbouncer binary: $PGBOUNCER, PATH, or the
// Debian location.
func findBouncer() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoBouncer
}

// startBouncer starts PgBouncer in front of database dbName of the server
// whose connection string is serverURL. As root it runs as the postgres
// user, since PgBouncer refuses to run as root.
func startBouncer(ctx context.Context, serverURL, dbName string) (*bouncer, error) {
	bin, err := findBouncer()
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
	cred, err := postgresCred("pgbouncer")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "chaos-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &bouncer{dir: dir}
	fail := func(err error) (*bouncer, error) {
		b.stop()
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
		if b.port, err = freePort(); err != nil {
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
		iniPath := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
			return fail(err)
		}
		b.cmd = exec.Command(bin, iniPath)
		b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
		b.cmd.Stdout, b.cmd.Stderr = nil, nil
		if err = b.cmd.Start(); err != nil {
			return fail(fmt.Errorf("chaos: start pgbouncer: %w", err))
		}
		b.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(b.cmd, b.done)
		if err = b.waitReady(ctx, dbName); err == nil {
			return b, nil
		}
		b.kill()
	}
	return fail(fmt.Errorf("chaos: pgbouncer did not start: %w; log: %s", err, b.logTail()))
}

// URL returns a connection string to dbName through the bouncer, with the
// settings a pgx client needs under transaction pooling.
func (b *bouncer) URL(dbName, appName string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&application_name=%s&default_query_exec_mode=exec&connect_timeout=5",
		b.port, dbName, appName)
}

func (b *bouncer) waitReady(ctx context.Context, dbName string) error {
	deadline := time.Now().Add(15 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-b.done:
			return errors.New("pgbouncer exited")
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, b.URL(dbName, harnessAppName))
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

func (b *bouncer) logTail() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return strings.TrimSpace(string(data))
}

// exited reports whether PgBouncer has exited (before kill or stop).
func (b *bouncer) exited() bool {
	if b.done == nil {
		return false
	}
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

func (b *bouncer) kill() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
}

// stop stops PgBouncer and removes its files.
func (b *bouncer) stop() {
	b.kill()
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// postgresCred is the postgres user's credential when this process runs as
// root (PostgreSQL, PgBouncer and Patroni refuse to run as root), else nil.
func postgresCred(what string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	pu, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("chaos: running as root and there is no postgres user to run %s as", what)
	}
	uid, _ := strconv.Atoi(pu.Uid)
	gid, _ := strconv.Atoi(pu.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
