package chaos

// The Patroni topology (Config.Patroni): etcd and two PostgreSQL nodes
// under Patroni on loopback, started and torn down by the harness. The
// instances reach the primary through a multi-host connection string with
// target_session_attrs=read-write; see docs/RELIABILITY.md for why.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/harness/child"
	"github.com/pgclaim/pgclaim/pgtest"
)

// ErrNoPatroni is returned when the patroni, patronictl or etcd binaries
// cannot be found.
var ErrNoPatroni = errors.New("chaos: patroni, patronictl or etcd not found (apt-get install patroni etcd-server)")

// patroniBins are the binaries the Patroni topology needs.
type patroniBins struct {
	patroni, patronictl, etcd, pgBin string
}

// findPatroni returns the binaries: PATH, or the Debian locations, and the
// PostgreSQL server binaries Patroni runs (the directory
// PGCLAIM_TEST_PG_BIN names, else pg_config's, else the newest
// /usr/lib/postgresql/*/bin).
func findPatroni() (patroniBins, error) {
	var b patroniBins
	look := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range []string{"/usr/bin", "/usr/sbin"} {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				return filepath.Join(d, name)
			}
		}
		return ""
	}
	b.patroni, b.patronictl, b.etcd = look("patroni"), look("patronictl"), look("etcd")
	if b.patroni == "" || b.patronictl == "" || b.etcd == "" {
		return b, ErrNoPatroni
	}
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "postgres"))
		return err == nil
	}
	if d := os.Getenv(pgtest.EnvBin); d != "" {
		// The binaries a run was asked to use, or none: a run on one major
		// version never runs Patroni on another.
		for _, tool := range []string{"postgres", "initdb", "pg_ctl", "pg_controldata", "pg_basebackup", "pg_rewind"} {
			if _, err := os.Stat(filepath.Join(d, tool)); err != nil {
				return b, fmt.Errorf("chaos: Patroni needs %s, not in %s=%s (server-only builds lack the client tools)", tool, pgtest.EnvBin, d)
			}
		}
		b.pgBin = d
		return b, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil && has(strings.TrimSpace(string(out))) {
		b.pgBin = strings.TrimSpace(string(out))
	}
	if b.pgBin == "" {
		ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(ds, func(i, j int) bool {
			vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(ds[i])))
			vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(ds[j])))
			return vi > vj
		})
		for _, d := range ds {
			if has(d) {
				b.pgBin = d
				break
			}
		}
	}
	if b.pgBin == "" {
		return b, errors.New("chaos: PostgreSQL server binaries not found (pg_config --bindir, /usr/lib/postgresql/*/bin)")
	}
	return b, nil
}

// Patroni's timing, in the DCS (dynamic) configuration. primary_start_timeout
// 0 makes Patroni fail over as soon as the primary's postmaster is found
// dead, instead of restarting it in place (which would hide the failover);
// use_pg_rewind lets a demoted primary rejoin on the new timeline.
const (
	patroniTTL      = 10 // seconds: the leader key's lifetime in etcd
	patroniLoopWait = 1
	patroniRetry    = 5
)

// patroniNode is one PostgreSQL node under Patroni.
type patroniNode struct {
	name      string // "node1"
	dir       string // its own directory (data/, pgpass, socket)
	conf      string // its Patroni configuration file
	log       string // Patroni's output
	pgPort    int
	restPort  int
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
	processes int // Patroni processes started
}

// patroniCluster is etcd and the nodes.
type patroniCluster struct {
	bins    patroniBins
	dir     string // data of etcd and the nodes; removed by stop
	logDir  string
	cred    *syscall.Credential // the postgres user when running as root
	etcd    *exec.Cmd
	etcdEnd chan struct{}
	etcdURL string
	nodes   []*patroniNode
	http    *http.Client
	sync    bool
	logf    func(format string, args ...any)
}

// The reaper stops what the cluster left running when the harness dies
// without stopping it (pids of Patroni and etcd in pids/, postmasters from
// their postmaster.pid), and removes its files.
const patroniReaper = `read -r _
for f in "$1"/pids/*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
for d in "$1"/node*/data; do
  pid=$(head -n 1 "$d/postmaster.pid" 2>/dev/null)
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
done
sleep 1
rm -rf "$1"
`

// reapers are the clean-up processes; their stdin stays open for the life
// of this process, and ends with it.
var (
	reaperMu sync.Mutex
	reapers  []*child.Process
)

// startPatroni starts etcd, the first node (it initialises the cluster and
// leads), then the second (a replica from a base backup), and waits until
// the replica streams; with sync, it turns synchronous_mode on through
// patronictl edit-config and waits for the replica to become the
// synchronous standby.
func startPatroni(ctx context.Context, logDir string, sync bool, logf func(string, ...any)) (*patroniCluster, error) {
	bins, err := findPatroni()
	if err != nil {
		return nil, err
	}
	c := &patroniCluster{bins: bins, logDir: logDir, sync: sync, logf: logf, http: &http.Client{Timeout: time.Second}}
	if c.cred, err = bouncer.PostgresCred("Patroni"); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "chaos-patroni-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	if err := c.mkdir(c.dir); err != nil {
		return nil, err
	}
	if err := c.mkdir(filepath.Join(c.dir, "pids")); err != nil {
		return nil, err
	}
	if err := c.startReaper(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	for i := 1; i <= 2; i++ {
		n, err := c.newNode(i)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	began := time.Now()
	if err := c.startNode(c.nodes[0]); err != nil {
		return nil, err
	}
	if err := c.waitRole(ctx, c.nodes[0], "primary", 2*time.Minute); err != nil {
		return nil, err
	}
	tPrimary := time.Since(began)
	if err := c.startNode(c.nodes[1]); err != nil {
		return nil, err
	}
	if err := c.waitRole(ctx, c.nodes[1], "replica", 2*time.Minute); err != nil {
		return nil, err
	}
	tReplica := time.Since(began)
	if sync {
		out, err := c.patronictl(ctx, "edit-config", "-s", "synchronous_mode=true", "--force")
		if err != nil {
			return nil, fmt.Errorf("chaos: patronictl edit-config -s synchronous_mode=true: %v: %s", err, out)
		}
		if err := c.waitRole(ctx, c.nodes[1], "sync", 2*time.Minute); err != nil {
			return nil, err
		}
	}
	logf("Patroni cluster up in %s (primary after %s, replica after %s): etcd %s, %s (primary) and %s (replica%s)",
		time.Since(began).Round(100*time.Millisecond), tPrimary.Round(100*time.Millisecond), tReplica.Round(100*time.Millisecond),
		c.etcdURL, c.nodes[0].addr(), c.nodes[1].addr(), map[bool]string{true: ", synchronous", false: ", asynchronous"}[sync])
	ok = true
	return c, nil
}

func (n *patroniNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.pgPort) }

// mkdir creates dir owned by the user Patroni runs as, mode 700.
func (c *patroniCluster) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if c.cred != nil {
		return os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid))
	}
	return nil
}

func (c *patroniCluster) startReaper() error {
	p, err := child.Start(child.Config{Exe: "/bin/sh", Args: []string{"-c", patroniReaper, "chaos-patroni-reaper", c.dir}, OwnGroup: true})
	if err != nil {
		return fmt.Errorf("chaos: start clean-up process: %w", err)
	}
	reaperMu.Lock()
	reapers = append(reapers, p)
	reaperMu.Unlock()
	return nil
}

// command prepares a child of the cluster: its own process group, run as
// the postgres user when the harness is root, output appended to logPath.
func (c *patroniCluster) command(logPath, bin string, args ...string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8", "HOME="+c.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd, nil
}

// started records a child's pid for the reaper and closes the log file
// the child inherited.
func (c *patroniCluster) started(name string, cmd *exec.Cmd) {
	if f, ok := cmd.Stdout.(*os.File); ok {
		f.Close()
	}
	_ = os.WriteFile(filepath.Join(c.dir, "pids", name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

func (c *patroniCluster) startEtcd(ctx context.Context) error {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		client, err1 := bouncer.FreePort()
		peer, err2 := bouncer.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			last = err
			continue
		}
		data := filepath.Join(c.dir, "etcd")
		_ = os.RemoveAll(data)
		if err := c.mkdir(data); err != nil {
			return err
		}
		c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
		cmd, err := c.command(filepath.Join(c.logDir, "etcd.log"), c.bins.etcd,
			"--name", "e1", "--data-dir", data,
			"--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "e1="+peerURL, "--initial-cluster-state", "new")
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("chaos: start etcd: %w", err)
		}
		c.started("etcd", cmd)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		c.etcd, c.etcdEnd = cmd, done
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-done:
				last = errors.New("etcd exited during start-up (see etcd.log)")
			default:
				if body, err := c.get(c.etcdURL + "/health"); err == nil && bytes.Contains(body, []byte(`"true"`)) {
					return nil
				} else if err != nil {
					last = err
				}
			}
			if last != nil && strings.Contains(last.Error(), "exited") {
				break
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
		}
		c.stopEtcd()
	}
	return fmt.Errorf("chaos: etcd did not start: %w", last)
}

func (c *patroniCluster) stopEtcd() {
	if c.etcd == nil {
		return
	}
	_ = c.etcd.Process.Kill()
	<-c.etcdEnd
	c.etcd = nil
}

// newNode writes node i's Patroni configuration (JSON, which is YAML).
func (c *patroniCluster) newNode(i int) (*patroniNode, error) {
	n := &patroniNode{name: fmt.Sprintf("node%d", i), dir: filepath.Join(c.dir, fmt.Sprintf("node%d", i))}
	n.conf = filepath.Join(c.dir, n.name+".yml")
	n.log = filepath.Join(c.logDir, "patroni-"+n.name+".log")
	if err := c.mkdir(n.dir); err != nil {
		return nil, err
	}
	var err1, err2 error
	n.pgPort, err1 = bouncer.FreePort()
	n.restPort, err2 = bouncer.FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	rest := fmt.Sprintf("127.0.0.1:%d", n.restPort)
	conf := map[string]any{
		"scope":   "chaos",
		"name":    n.name,
		"restapi": map[string]any{"listen": rest, "connect_address": rest},
		"etcd3":   map[string]any{"hosts": strings.TrimPrefix(c.etcdURL, "http://")},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": patroniTTL, "loop_wait": patroniLoopWait, "retry_timeout": patroniRetry,
				"maximum_lag_on_failover": 1 << 20,
				"synchronous_mode":        false,
				"primary_start_timeout":   0,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						"wal_log_hints": "on", "wal_keep_size": "64MB",
						// A throwaway cluster, as the harness's own: commits
						// reach the operating system before they are
						// acknowledged, so killing a node loses nothing
						// committed on it.
						"fsync": "off", "shared_buffers": "32MB",
						"max_connections": 400, "max_locks_per_transaction": 256,
					},
				},
			},
			// A throwaway cluster: no sync of the new files to disk.
			"initdb": []any{map[string]any{"encoding": "UTF8"}, map[string]any{"locale": "C"}, map[string]any{"auth": "trust"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          n.addr(),
			"connect_address": n.addr(),
			"data_dir":        filepath.Join(n.dir, "data"),
			"bin_dir":         c.bins.pgBin,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			// The replica's base backup: an immediate checkpoint, no sync.
			"basebackup": []any{map[string]any{"checkpoint": "fast"}, "no-sync"},
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": "postgres"},
				"replication": map[string]any{"username": "postgres"},
				"rewind":      map[string]any{"username": "postgres"},
			},
			// A rewind that fails, or a timeline the old primary cannot
			// follow, is repaired by a new base backup, never by starting
			// the old data as it is.
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
			"parameters": map[string]any{
				"unix_socket_directories": n.dir,
				"log_min_messages":        "warning",
				"logging_collector":       "on",
				"log_directory":           "log",
			},
			"pg_hba": []string{"local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"},
		},
		"watchdog": map[string]any{"mode": "off"},
	}
	raw, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.conf, raw, 0o644); err != nil {
		return nil, err
	}
	return n, nil
}

// startNode starts (or starts again) the node's Patroni.
func (c *patroniCluster) startNode(n *patroniNode) error {
	cmd, err := c.command(n.log, c.bins.patroni, n.conf)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start patroni %s: %w", n.name, err)
	}
	c.started("patroni-"+n.name, cmd)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.processes++
	n.mu.Unlock()
	return nil
}

// stop ends every process of the cluster and removes its files.
func (c *patroniCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); c.killNode(context.Background(), n) }()
	}
	wg.Wait()
	c.stopEtcd()
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}
