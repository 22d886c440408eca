package chaos

// What a Patroni run watches while the faults go on: the instances'
// lines, the first events after each promotion, the sampler.

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// line takes an instance's output line: a batch claimed ("B"), rows
// finished DONE and acknowledged ("D holder id:fence ..."), a schedule
// run's success acknowledged ("R holder schedule instant-µs fence").
func (p *patroniRun) line(b []byte) {
	now := time.Now()
	switch {
	case string(b) == msgBatchStart:
		p.first(now, func(e *promotion) *time.Time { return &e.firstClaim })
	case bytes.HasPrefix(b, []byte(msgAckRows+" ")):
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return
		}
		p.mu.Lock()
		for _, kv := range f[2:] {
			k, v, _ := strings.Cut(kv, ":")
			id, err1 := strconv.ParseInt(k, 10, 64)
			fence, err2 := strconv.ParseInt(v, 10, 64)
			if err1 == nil && err2 == nil {
				p.rows[id] = ack{holder: f[1], fence: fence}
			}
		}
		p.mu.Unlock()
	case bytes.HasPrefix(b, []byte(msgAckRun+" ")):
		f := strings.Fields(string(b))
		if len(f) != 5 {
			return
		}
		us, err1 := strconv.ParseInt(f[3], 10, 64)
		fence, err2 := strconv.ParseInt(f[4], 10, 64)
		if err1 != nil || err2 != nil {
			return
		}
		p.mu.Lock()
		p.runs[runKey{f[2], us}] = ack{holder: f[1], fence: fence}
		p.mu.Unlock()
		p.first(now, func(e *promotion) *time.Time { return &e.firstRun })
	}
}

// first sets the latest promotion's field to now, if it is the first such
// event since the promotion.
func (p *patroniRun) first(now time.Time, field func(*promotion) *time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.events) == 0 {
		return
	}
	e := p.events[len(p.events)-1]
	if t := field(e); !e.promoted.IsZero() && now.After(e.promoted) && t.IsZero() {
		*t = now
	}
}

// startSampler runs sample until ctx ends; check waits for it.
//
// sample asks both nodes every 100 ms whether they are in recovery, each
// on a connection of its own with a 500 ms deadline (a silent node does not
// answer): a round in which both answer that they are not is two writable
// primaries.
func (p *patroniRun) startSampler(ctx context.Context) {
	p.sampling.Add(1)
	go func() { defer p.sampling.Done(); p.sample(ctx) }()
}

func (p *patroniRun) sample(ctx context.Context) {
	nodes := p.c.nodes
	conns := make([]*pgx.Conn, len(nodes))
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.Background())
			}
		}
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		writable := make([]bool, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
				if conns[i] == nil {
					c, err := pgx.Connect(qctx, n.url("postgres"))
					if err != nil {
						return
					}
					conns[i] = c
				}
				var rec bool
				if err := conns[i].QueryRow(qctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
					_ = conns[i].Close(context.Background())
					conns[i] = nil
					return
				}
				writable[i] = !rec
			}()
		}
		wg.Wait()
		p.mu.Lock()
		p.dual.Checked++
		if !slices.Contains(writable, false) {
			p.dual.fail("at %s both %s and %s answered pg_is_in_recovery() = false", time.Now().Format("15:04:05.000"), nodes[0].name, nodes[1].name)
		}
		p.mu.Unlock()
	}
}
