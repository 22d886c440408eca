package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// herdTrace, when PGCLAIM_BENCH_HERD_TRACE names a file, writes one line
// per statement of the herd's pgclaim pools: instance, statement name,
// start (Unix µs), duration (µs).
var herdTrace = func() *traceFile {
	p := os.Getenv("PGCLAIM_BENCH_HERD_TRACE")
	if p == "" {
		return nil
	}
	f, err := os.Create(p)
	if err != nil {
		panic(err)
	}
	return &traceFile{w: bufio.NewWriterSize(f, 1<<20), f: f}
}()

type traceFile struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

type traceKey struct{}

type traceStart struct {
	at   time.Time
	name string
}

func (t *traceFile) start(ctx context.Context, d pgx.TraceQueryStartData) context.Context {
	name := "?"
	if s := d.SQL; strings.HasPrefix(s, "-- name: ") {
		name = strings.Fields(s[len("-- name: "):])[0]
	} else if len(s) > 0 {
		name = strings.Fields(s)[0]
	}
	return context.WithValue(ctx, traceKey{}, traceStart{time.Now(), name})
}

func (t *traceFile) end(ctx context.Context, inst int, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	t.mu.Lock()
	fmt.Fprintf(t.w, "%d %s %d %d %d\n", inst, s.name, s.at.UnixMicro(), time.Since(s.at).Microseconds(), d.CommandTag.RowsAffected())
	t.mu.Unlock()
}

func (t *traceFile) flush() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.w.Flush()
	t.mu.Unlock()
}
