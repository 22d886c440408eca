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
	"io"
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgclaim "github.com/pgclaim/pgclaim"
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

// patroniPid returns the node's Patroni process id, 0 when it is not
// running.
func (n *patroniNode) patroniPid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	select {
	case <-n.done:
		return 0
	default:
		return n.cmd.Process.Pid
	}
}

// postmaster returns the node's postmaster's process id, from
// postmaster.pid (Patroni starts it in a session of its own, reparented to
// PID 1), 0 when none is alive.
func (n *patroniNode) postmaster() int {
	b, err := os.ReadFile(filepath.Join(n.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || !alive(pid) {
		return 0
	}
	return pid
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if pp, _ := strconv.Atoi(f[1]); pp == pid {
				out = append(out, p)
			}
		}
	}
	return out
}

// walSenders returns the process ids of the node's WAL senders.
func (n *patroniNode) walSenders() []int {
	pm := n.postmaster()
	if pm == 0 {
		return nil
	}
	var out []int
	for _, p := range children(pm) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err == nil && bytes.Contains(b, []byte("walsender")) {
			out = append(out, p)
		}
	}
	return out
}

// signalPostgres sends sig to the node's postmaster and every process it
// forked (postmaster first, so it forks nothing new meanwhile). It returns
// how many processes it signalled.
func (n *patroniNode) signalPostgres(sig syscall.Signal) int {
	pm := n.postmaster()
	if pm == 0 {
		return 0
	}
	k := 0
	if syscall.Kill(pm, sig) == nil {
		k++
	}
	for _, p := range children(pm) {
		if syscall.Kill(p, sig) == nil {
			k++
		}
	}
	return k
}

// signalPatroni sends sig to the node's Patroni process group.
func (n *patroniNode) signalPatroni(sig syscall.Signal) bool {
	pid := n.patroniPid()
	return pid != 0 && syscall.Kill(-pid, sig) == nil
}

// killNode SIGKILLs every process of the node (Patroni and PostgreSQL,
// stopped or not) and waits until they are gone.
func (c *patroniCluster) killNode(ctx context.Context, n *patroniNode) {
	pm := n.postmaster()
	var pids []int
	if pm != 0 {
		pids = append([]int{pm}, children(pm)...)
	}
	n.signalPatroni(syscall.SIGKILL)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		gone := true
		for _, p := range pids {
			gone = gone && !alive(p)
		}
		if gone {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
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

func (c *patroniCluster) get(url string) ([]byte, error) {
	resp, err := c.http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return body, nil
}

func (n *patroniNode) rest(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", n.restPort, path)
}

// is asks the node's REST API whether it is in role: "primary", "replica"
// or "sync" (the synchronous standby); 200 means yes.
func (c *patroniCluster) is(n *patroniNode, role string) bool {
	_, err := c.get(n.rest("/" + role))
	return err == nil
}

// waitRole waits until the node's REST API answers 200 for role.
func (c *patroniCluster) waitRole(ctx context.Context, n *patroniNode, role string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !c.is(n, role) {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: Patroni %s not %s after %s (log: %s)", n.name, role, timeout, n.log)
		}
		if !sleepCtx(ctx, 25*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// primary returns the node whose REST API says it is the primary, or nil.
func (c *patroniCluster) primary() *patroniNode {
	for _, n := range c.nodes {
		if c.is(n, "primary") {
			return n
		}
	}
	return nil
}

func (c *patroniCluster) other(n *patroniNode) *patroniNode {
	if c.nodes[0] == n {
		return c.nodes[1]
	}
	return c.nodes[0]
}

// switchover asks the primary's REST API to hand over to the replica;
// Patroni answers once the switchover is done, or refuses it.
func (c *patroniCluster) switchover(from, to *patroniNode) error {
	body, _ := json.Marshal(map[string]string{"leader": from.name, "candidate": to.name})
	cl := &http.Client{Timeout: time.Minute}
	resp, err := cl.Post(from.rest("/switchover"), "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("switchover %s → %s: %s: %s", from.name, to.name, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// config returns the cluster's dynamic configuration (REST /config).
func (c *patroniCluster) config(n *patroniNode) (map[string]any, error) {
	body, err := c.get(n.rest("/config"))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(body, &m)
}

func (c *patroniCluster) patronictl(ctx context.Context, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, c.bins.patronictl, append([]string{"-c", c.nodes[0].conf}, args...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8", "HOME="+c.dir)
	return cmd.CombinedOutput()
}

// url is the connection string to database db on whichever node is the
// primary: every node's address, target_session_attrs=read-write.
func (c *patroniCluster) url(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = n.addr()
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), db)
}

// nodeURL is the connection string to database db on node n alone.
func (n *patroniNode) url(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=1&application_name=%s", n.addr(), db, harnessAppName+"-probe")
}

// createDatabase creates database name on the primary with pgclaim's
// migrations and the workload's schema.
func (c *patroniCluster) createDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to the Patroni primary: %w", err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("chaos: create database on the Patroni primary: %w", err)
	}
	pool, err := pgxpool.New(ctx, c.url(name))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		return err
	}
	return setupSchema(ctx, pool)
}
