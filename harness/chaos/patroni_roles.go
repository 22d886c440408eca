package chaos

// The Patroni cluster's roles, read and changed through its REST API and
// patronictl: the primary, switchovers, the configuration, the URLs.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
)

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
