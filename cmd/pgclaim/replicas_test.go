package main

import (
	"bufio"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asProgram makes the test binary run as pgclaim itself: the tests start
// real processes of it.
const asProgram = "PGCLAIM_TEST_AS_PROGRAM"

func TestMain(m *testing.M) {
	if os.Getenv(asProgram) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// serveProcess is a "pgclaim serve" process.
type serveProcess struct {
	cmd    *exec.Cmd
	base   string
	stderr *syncBuffer
	done   chan error
}

// startServeProcess runs "pgclaim serve" as a process of its own on a free
// loopback port until stopped or the test ends.
func startServeProcess(t *testing.T, environ []string, args ...string) *serveProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), asProgram+"=1"), environ...)
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serveProcess{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	started := make(chan string, 1)
	re := regexp.MustCompile(`on (https?://\S+/) `)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			_, _ = p.stderr.Write([]byte(sc.Text() + "\n"))
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				started <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() { p.stop(t) })
	select {
	case p.base = <-started:
		return p
	case err := <-p.done:
		p.done <- err
		t.Fatalf("serve exited: %v\n%s", err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start:\n%s", p.stderr.String())
	}
	return nil
}

// stop ends the process as an operator's SIGTERM does and checks it exits 0.
func (p *serveProcess) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("serve: %v\n%s", err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("serve did not stop on SIGTERM:\n%s", p.stderr.String())
		<-p.done
	}
}

// TestServeReplicas runs two "pgclaim serve" processes against one
// database, as replicas behind a load balancer: a session logged in on one
// acts on the other, survives a restart, and ends when the secret changes.
func TestServeReplicas(t *testing.T) {
	db := reportDB(t)
	// act posts an action with the CSRF token of the page as c sees it.
	act := func(t *testing.T, c *http.Client, p *serveProcess, action string) int {
		t.Helper()
		csrf, _ := pageCSRF(t, c, p.base)
		return postForm(t, c, p.base+"actions/"+action, url.Values{"csrf": {csrf}, "name": {"report"}, "note": {"replicas"}})
	}

	t.Run("derived from the action token", func(t *testing.T) {
		environ := []string{"DATABASE_URL=" + db.URL, envActionToken + "=correct-horse-battery-staple"}
		a := startServeProcess(t, environ)
		b := startServeProcess(t, environ)
		c := newClient() // cookies are per host, not per port: a and b share them
		if code := postForm(t, c, a.base+"login", url.Values{"token": {"correct-horse-battery-staple"}}); code != http.StatusSeeOther {
			t.Fatalf("login on a: %d, want 303", code)
		}
		if code := act(t, c, b, "pause"); code != http.StatusSeeOther {
			t.Fatalf("pause on b with a's session: %d, want 303\n%s", code, b.stderr.String())
		}
		a.stop(t)
		a = startServeProcess(t, environ)
		if code := act(t, c, a, "resume"); code != http.StatusSeeOther {
			t.Fatalf("resume on a restarted with the same session: %d, want 303\n%s", code, a.stderr.String())
		}
		// Another token is another key: its sessions are not these.
		other := startServeProcess(t, []string{"DATABASE_URL=" + db.URL, envActionToken + "=another-horse-battery-staple"})
		if code := act(t, c, other, "pause"); code != http.StatusUnauthorized {
			t.Fatalf("pause on a replica with another token: %d, want 401", code)
		}
		if strings.Contains(a.stderr.String()+b.stderr.String(), "correct-horse") {
			t.Errorf("the token was logged")
		}
	})

	t.Run("configured key", func(t *testing.T) {
		key := "9f86d081884c7d659a2feaa0c55ad015"
		a := startServeProcess(t, []string{"DATABASE_URL=" + db.URL, envActionToken + "=correct-horse-battery-staple", "PGCLAIM_SESSION_KEY" + "=" + key})
		b := startServeProcess(t, []string{"DATABASE_URL=" + db.URL, envActionToken + "=correct-horse-battery-staple"}, "--session-key", key)
		rotated := startServeProcess(t, []string{"DATABASE_URL=" + db.URL, envActionToken + "=correct-horse-battery-staple", "PGCLAIM_SESSION_KEY" + "=60303ae22b998861bce3b28f33eec1be"})
		c := newClient()
		if code := postForm(t, c, a.base+"login", url.Values{"token": {"correct-horse-battery-staple"}}); code != http.StatusSeeOther {
			t.Fatalf("login on a: %d, want 303", code)
		}
		if code := act(t, c, b, "pause"); code != http.StatusSeeOther {
			t.Fatalf("pause on b with a's session: %d, want 303", code)
		}
		if code := act(t, c, rotated, "resume"); code != http.StatusUnauthorized {
			t.Fatalf("resume on a replica with a rotated key: %d, want 401", code)
		}
	})
}
