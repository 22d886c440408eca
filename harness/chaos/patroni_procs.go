package chaos

// A Patroni node's processes: Patroni's and the postmaster's pids, their
// children, signals, and a node killed whole.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

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
