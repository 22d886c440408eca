package bouncer

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBouncerSupervise: PgBouncer exiting on its known upstream bug is
// started again and recorded; any other exit is reported as unexpected.
// A script stands in for the pgbouncer binary.
func TestBouncerSupervise(t *testing.T) {
	for _, tc := range []struct {
		name   string
		line   string
		exited bool
		known  int
	}{
		{name: "known bug, server state", line: "2026-12-01 15:31:39.146 UTC [10630] FATAL @src/server.c:583 in function server_proto(): server_proto: server in bad state: 11", known: 1},
		{name: "known bug, client state", line: "2026-12-01 16:37:57.266 UTC [24017] FATAL @src/objects.c:1060 in function disconnect_client(): bad client state: 0", known: 1},
		{name: "other exit", line: "FATAL something else", exited: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			script := filepath.Join(dir, "fake-pgbouncer")
			// First start: log the line and exit. Later starts: run on.
			body := "#!/bin/sh\nd=$(dirname \"$1\")\nif [ ! -f \"$d/once\" ]; then touch \"$d/once\"; echo '" + tc.line + "' >> \"$d/pgbouncer.log\"; exit 1; fi\nexec sleep 30\n"
			if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			b := &Bouncer{dir: dir, bin: script, iniPath: filepath.Join(dir, "pgbouncer.ini")}
			if err := b.start(); err != nil {
				t.Fatal(err)
			}
			defer b.Kill()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			supervised := make(chan struct{})
			go func() { defer close(supervised); b.Supervise(ctx, t.Logf) }()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && len(b.KnownCrashes()) < tc.known {
				time.Sleep(20 * time.Millisecond)
			}
			if !tc.exited {
				time.Sleep(200 * time.Millisecond) // the restarted process runs on
			} else {
				<-supervised
			}
			if got := len(b.KnownCrashes()); got != tc.known {
				t.Fatalf("known crashes %d, want %d", got, tc.known)
			}
			if got := b.Exited(); got != tc.exited {
				t.Fatalf("Exited() = %v, want %v", got, tc.exited)
			}
		})
	}
}
