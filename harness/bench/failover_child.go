package bench

// The benchmarks' child processes: where a re-run executable goes
// (MaybeRunChild), and the failover scenario's, gate's Elector or the
// polling standby, each reporting its leadership one line an event.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/gate"
)

// MaybeRunChild runs a child process of the failover or instances
// scenario and exits when the process was started as one (an environment
// variable says so); otherwise it returns at once. Call it first thing in
// main (or in TestMain) of every program that runs the benchmarks.
func MaybeRunChild() {
	switch os.Getenv(envChild) {
	case "failover":
		os.Exit(runChild())
	case "instance":
		os.Exit(runInstanceChild())
	case "herd":
		os.Exit(runHerdChild())
	}
}

// childOut writes the child's events to stdout, one line each:
// "ready", "leader <unix ns> <term>", "lost <unix ns>", "error <text>".
type childOut struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *childOut) emit(kind string, fields ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprint(o.w, kind)
	for _, f := range fields {
		fmt.Fprint(o.w, " ", f)
	}
	fmt.Fprintln(o.w)
	o.w.Flush()
}

func runChild() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The parent holds our stdin open; when it goes away, so do we.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	out := &childOut{w: bufio.NewWriter(os.Stdout)}
	mode, url, name := os.Getenv(envMode), os.Getenv(envURL), os.Getenv(envElection)
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil && mode != "poll" {
		out.emit("error", "bad TTL:", err)
		return 2
	}
	holder := fmt.Sprintf("child-%d", os.Getpid())
	switch mode {
	case "advisory", "lease":
		pool, err := openPool(ctx, url, 4)
		if err != nil {
			out.emit("error", oneLine(err.Error()))
			return 1
		}
		defer pool.Close()
		mechanism := gate.Advisory
		if mode == "lease" {
			mechanism = gate.LeaseRow
		}
		el, err := gate.NewElector(pool, name, gate.ElectorConfig{
			Holder: holder, Mechanism: mechanism, TTL: ttl,
		})
		if err != nil {
			out.emit("error", oneLine(err.Error()))
			return 1
		}
		out.emit("ready")
		for ctx.Err() == nil {
			lctx, err := el.Campaign(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return 0
				}
				out.emit("error", oneLine(err.Error()))
				time.Sleep(50 * time.Millisecond)
				continue
			}
			out.emit("leader", time.Now().UnixNano(), el.Fence())
			select {
			case <-lctx.Done():
				out.emit("lost", time.Now().UnixNano())
			case <-ctx.Done():
				return 0
			}
		}
		return 0
	case "poll":
		return pollChild(ctx, out, url, name)
	}
	out.emit("error", "unknown mode", mode)
	return 2
}

// pollChild is the baseline: a standby that polls pg_try_advisory_lock
// every 10 ms on a dedicated connection, and a leader that checks its
// session as often.
func pollChild(ctx context.Context, out *childOut, url, name string) int {
	class, key := gate.AdvisoryKey(name)
	out.emit("ready")
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			time.Sleep(pollEvery)
			continue
		}
		led := false
		for ctx.Err() == nil {
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", class, key).Scan(&ok); err != nil {
				break
			}
			if ok {
				led = true
				out.emit("leader", time.Now().UnixNano(), 0)
				break
			}
			time.Sleep(pollEvery)
		}
		for led && ctx.Err() == nil {
			time.Sleep(pollEvery)
			if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
				out.emit("lost", time.Now().UnixNano())
				break
			}
		}
		conn.Close(context.Background())
	}
	return 0
}
