package pgtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBinDirSetting: Config.BinDir, else PGCLAIM_TEST_PG_BIN, names the
// binaries; a directory without them is an error naming the setting, not a
// quiet fallback to other binaries.
func TestBinDirSetting(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvBin, empty)
	if _, err := findBinDir(""); err == nil || !strings.Contains(err.Error(), EnvBin) {
		t.Fatalf("%s=%s (no binaries): got %v, want an error naming %s", EnvBin, empty, err, EnvBin)
	}
	if _, err := findBinDir(t.TempDir()); err == nil {
		t.Fatal("BinDir without binaries: no error")
	}
	t.Setenv(EnvBin, "")
	sys, err := findBinDir("")
	if err != nil {
		t.Skip(err)
	}
	t.Setenv(EnvBin, sys)
	if got, err := findBinDir(""); err != nil || got != sys {
		t.Fatalf("%s=%s: got %q, %v", EnvBin, sys, got, err)
	}
}

// TestServerIsEnvBin: with PGCLAIM_TEST_PG_BIN set, the local server tests
// run on is of the version of the binaries there (a run "on 13" is on 13).
func TestServerIsEnvBin(t *testing.T) {
	t.Parallel()
	bin := os.Getenv(EnvBin)
	if bin == "" || os.Getenv(EnvURL) != "" {
		t.Skipf("%s unset, or %s set", EnvBin, EnvURL)
	}
	s := Shared(t)
	out, err := exec.Command(bin+"/postgres", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	// "postgres (PostgreSQL) 13.23"
	f := strings.Fields(string(out))
	want := f[len(f)-1]
	admin, err := s.Admin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := admin.QueryRow(context.Background(), "SELECT current_setting('server_version')").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, want) {
		t.Fatalf("server version %s, binaries in %s are %s", got, bin, want)
	}
	t.Logf("server %s from %s", got, bin)
}

// TestOlderServerPaths runs what pgtest does differently before PostgreSQL
// 15 (CREATE DATABASE without STRATEGY) and 14 (pg_terminate_backend
// without a timeout, and a wait of pgtest's own), on whatever server the
// tests have, by making a Server believe it talks to PostgreSQL 13.
func TestOlderServerPaths(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{URL: Shared(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.version = 130000
	db, err := s.CreateDatabase(ctx, Template{Name: "pgclaim"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Drop(ctx)
	p := onePool(t, db)
	pid := backendPID(t, p)
	if err := s.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	// Terminate returned once the backend was gone: nothing of it is left.
	var left bool
	if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", int32(pid)).Scan(&left); err != nil || left {
		t.Fatalf("backend %d still listed after Terminate (%v)", pid, err)
	}
	if _, err := p.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("query on a terminated backend succeeded")
	}
	if err := s.Terminate(ctx, pid); err == nil {
		t.Fatal("terminating a backend that is gone reported success")
	}
	q := onePool(t, db)
	backendPID(t, q)
	if n, err := s.TerminateDatabase(ctx, db.Name); err != nil || n < 2 {
		t.Fatalf("TerminateDatabase: %d, %v; want at least 2", n, err)
	}
}

// TestPairWithoutBaseBackup starts a Pair as on server-only builds, which
// lack pg_basebackup: the standby is a copy of the primary shut down, and
// streams what the primary writes after.
func TestPairWithoutBaseBackup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := NewPair(t, PairConfig{noBaseBackup: true})
	if err := p.primaryExec(ctx, "CREATE TABLE after_copy (x int)", "INSERT INTO after_copy VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	var x int
	var recovering bool
	if err := queryRow(ctx, p.StandbyURL("postgres"), "SELECT x, pg_is_in_recovery() FROM after_copy", &x, &recovering); err != nil {
		t.Fatal(err)
	}
	if x != 42 || !recovering {
		t.Fatalf("standby: x = %d, in recovery %v; want 42, true", x, recovering)
	}
}
