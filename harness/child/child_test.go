package child

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

const envRole = "PGCLAIM_CHILD_TEST_ROLE"

// TestMain turns the test binary into the child when envRole is set: it
// echoes each line of its standard input to standard output and, prefixed,
// to standard error, and exits 3 at the end of its input.
func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "echo" {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println(sc.Text(), strings.Join(os.Args[1:], ","))
			fmt.Fprintln(os.Stderr, "err:", sc.Text())
		}
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func TestStartEcho(t *testing.T) {
	var (
		mu       sync.Mutex
		out, err []string
	)
	p, e := Start(Config{
		Args:     []string{"a", "b"},
		Env:      []string{envRole + "=echo"},
		Stdout:   func(l []byte) { mu.Lock(); out = append(out, string(l)); mu.Unlock() },
		Stderr:   func(l []byte) { mu.Lock(); err = append(err, string(l)); mu.Unlock() },
		OwnGroup: true,
	})
	if e != nil {
		t.Fatal(e)
	}
	if p.Pid() <= 0 {
		t.Errorf("Pid() = %d", p.Pid())
	}
	fmt.Fprintln(p.Stdin, "one")
	fmt.Fprintln(p.Stdin, "two")
	p.Stdin.Close()
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("child did not exit")
	}
	var ee *exec.ExitError
	if e := p.Err(); !errors.As(e, &ee) || ee.ExitCode() != 3 {
		t.Errorf("Err() = %v, want exit status 3", e)
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(out, "|"), "one a,b|two a,b"; got != want {
		t.Errorf("stdout lines %q, want %q", got, want)
	}
	if got, want := strings.Join(err, "|"), "err: one|err: two"; got != want {
		t.Errorf("stderr lines %q, want %q", got, want)
	}
}

func TestKill(t *testing.T) {
	var sb strings.Builder
	p, err := Start(Config{Env: []string{envRole + "=echo"}, StderrTo: &sb})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if p.Err() == nil {
		t.Error("Err() = nil after Kill")
	}
}

func TestStartMissing(t *testing.T) {
	if _, err := Start(Config{Exe: "/nonexistent/pgclaim-child"}); err == nil {
		t.Error("Start of a missing program: no error")
	}
}
