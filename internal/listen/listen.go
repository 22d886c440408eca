// Package listen is the one connection of a process that listens for
// pgclaim's notifications on a pool: every claim Worker and Scheduler of the
// process on that pool subscribes to it, so that listening costs one
// connection per pool (budget.DedicatedSessions counts it) whatever the number
// of subscribers. It is taken out of the pool (pgxpool.Conn.Hijack) when
// the first subscriber arrives and closed when the last one leaves.
//
// Subscribers are told three things: a notification on their channel (a
// wake-up, or a payload), that the connection was (re)established — anything
// may have been announced while it was down, so look once now — and whether
// it is listening at all (behind a transaction-mode pooler it cannot: the
// subscribers poll).
package listen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// ApplicationName is the listening session's application_name, as
// pg_stat_activity shows it.
const ApplicationName = "pgclaim listener"

// pingEvery is how long the connection may be quiet before a ping checks it;
// pingBound bounds the ping.
const (
	pingEvery = 10 * time.Second
	pingBound = 5 * time.Second
)

// errPooler: the listening connection reaches the server through a pooler
// in transaction mode, where a LISTEN does not outlive its transaction.
var errPooler = errors.New("the connection reaches PostgreSQL through a connection pooler in transaction mode (pg_backend_pid differs from the pid announced at connect): LISTEN cannot work there")

// Mode is how the subscribers of a pool learn of new work.
type Mode int32

const (
	// Connecting: no listening connection yet (or between two).
	Connecting Mode = iota
	// Listening: notifications arrive.
	Listening
	// Polling: LISTEN cannot work on this pool (a pooler in transaction
	// mode): only the subscribers' polls find work.
	Polling
)

// Sub is one subscription to a channel. Without Options.Payloads, Wake
// receives a value (coalesced: at most one waits) for a notification its
// filter accepts and for every (re)connection of the listening session.
// With it, Notes receives each payload, and "" for a (re)connection; Wake
// then receives a value when payloads were dropped because Notes was full.
// Either way Wake and "" mean: look at everything once.
type Sub struct {
	h       *hub
	channel string
	filter  string // wake only for this payload; "" any
	one     bool   // wake one idle subscriber of the group, not all
	wake    chan struct{}
	notes   chan string
	idle    atomic.Bool
	closed  atomic.Bool
}

// Wake returns the channel woken for new work.
func (s *Sub) Wake() <-chan struct{} { return s.wake }

// Notes returns the channel of payloads (nil without Options.Payloads).
func (s *Sub) Notes() <-chan string { return s.notes }

// Idle says whether the subscriber waits for work (true) or is busy: a
// notification for a group (Options.One) goes to an idle member first.
func (s *Sub) Idle(idle bool) { s.idle.Store(idle) }

// Relay passes a notification on to another idle member of s's group: the
// woken one found more work than it takes at once.
func (s *Sub) Relay() { s.h.deliver(s.channel, s.filter, s) }

// Listening reports whether notifications on s's channel reach s now.
func (s *Sub) Listening() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.h.listened[s.channel] && s.Mode() == Listening
}

// Mode reports how the pool's subscribers learn of work now.
func (s *Sub) Mode() Mode { return Mode(s.h.mode.Load()) }

// Close ends the subscription; the connection closes with the last one.
func (s *Sub) Close() {
	if s.closed.Swap(true) {
		return
	}
	s.h.unsubscribe(s)
}

// Options shape a subscription.
type Options struct {
	// Filter, when set, wakes the subscriber only for this payload.
	Filter string
	// One makes the subscribers of one channel and filter a group: a
	// notification wakes one idle member (any member when none is idle),
	// which passes it on with Relay when it found more than it takes.
	One bool
	// Payloads delivers every payload on Notes.
	Payloads bool
	// Logger receives the listener's records while this subscriber is the
	// first (connection lost, pooler found). Default slog.Default().
	Logger *slog.Logger
}

// hub is one pool's listening session and its subscribers.
type hub struct {
	pool *pgxpool.Pool
	log  *slog.Logger

	mode atomic.Int32 // a Mode

	mu        sync.Mutex
	subs      map[string][]*Sub // by channel, in subscription order
	next      map[string]int    // round-robin position of each group
	listened  map[string]bool   // channels LISTENed on the current connection
	interrupt context.CancelFunc
	stop      context.CancelFunc
	done      chan struct{}
}

var hubs = struct {
	mu sync.Mutex
	m  map[*pgxpool.Pool]*hub
}{m: map[*pgxpool.Pool]*hub{}}

// Subscribe subscribes to channel on pool's listening session, opening it
// for the first subscriber of the process.
func Subscribe(pool *pgxpool.Pool, channel string, o Options) *Sub {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	h := hubs.m[pool]
	if h == nil {
		log := o.Logger
		if log == nil {
			log = slog.Default()
		}
		h = &hub{pool: pool, log: log, subs: map[string][]*Sub{}, next: map[string]int{}, listened: map[string]bool{}}
		hubs.m[pool] = h
	}
	s := &Sub{h: h, channel: channel, filter: o.Filter, one: o.One, wake: make(chan struct{}, 1)}
	if o.Payloads {
		s.notes = make(chan string, 256)
	}
	h.mu.Lock()
	h.subs[channel] = append(h.subs[channel], s)
	if h.done == nil {
		ctx, cancel := context.WithCancel(context.Background())
		h.stop, h.done = cancel, make(chan struct{})
		go h.run(ctx, h.done)
	} else if !h.listened[channel] && h.interrupt != nil {
		h.interrupt()
	}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *Sub) {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	h.mu.Lock()
	subs := h.subs[s.channel]
	for i, x := range subs {
		if x == s {
			subs = append(subs[:i:i], subs[i+1:]...)
			break
		}
	}
	if len(subs) == 0 {
		delete(h.subs, s.channel)
	} else {
		h.subs[s.channel] = subs
	}
	last := len(h.subs) == 0
	var stop context.CancelFunc
	var done chan struct{}
	if last {
		stop, done = h.stop, h.done
		h.stop, h.done = nil, nil
		if hubs.m[h.pool] == h {
			delete(hubs.m, h.pool)
		}
	}
	h.mu.Unlock()
	if last && stop != nil {
		stop()
		<-done
	}
}

// deliver wakes the subscribers of channel that payload concerns: each
// subscriber of a payload, and of each group one idle member other than
// except (any member when none is idle).
func (h *hub) deliver(channel, payload string, except *Sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.subs[channel]
	groups := map[string]bool{}
	for _, s := range subs {
		if s.notes != nil {
			if except == nil {
				select {
				case s.notes <- payload:
				default:
					signal(s) // full: the subscriber looks at everything once
				}
			}
			continue
		}
		if s.filter != "" && s.filter != payload {
			continue
		}
		if !s.one {
			if s != except {
				signal(s)
			}
			continue
		}
		groups[s.filter] = true
	}
	for filter := range groups {
		var members []*Sub
		for _, s := range subs {
			if s.one && s.filter == filter && s != except {
				members = append(members, s)
			}
		}
		if len(members) == 0 {
			continue
		}
		key := channel + "\x00" + filter
		start := h.next[key]
		pick := members[start%len(members)]
		for i := range members {
			if m := members[(start+i)%len(members)]; m.idle.Load() {
				pick = m
				break
			}
		}
		h.next[key] = start + 1
		signal(pick)
	}
}

// everyone wakes every subscriber, with "" on Notes: the session was
// (re)established.
func (h *hub) everyone() {
	h.mu.Lock()
	channels := make([]string, 0, len(h.subs))
	for ch := range h.subs {
		channels = append(channels, ch)
	}
	h.mu.Unlock()
	for _, ch := range channels {
		h.wakeChannel(ch)
	}
}

// wakeChannel wakes every subscriber of channel, with "" on Notes.
func (h *hub) wakeChannel(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.subs[channel] {
		if s.notes != nil {
			select {
			case s.notes <- "":
				continue
			default:
			}
		}
		signal(s)
	}
}

func signal(s *Sub) {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run keeps a listening session open until ctx ends.
func (h *hub) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	defer h.mode.Store(int32(Connecting))
	failures := 0
	for ctx.Err() == nil {
		up, err := h.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if up {
			failures = 0
		}
		failures++
		wait := time.Second
		switch {
		case errors.Is(err, errPooler):
			if h.mode.Swap(int32(Polling)) != int32(Polling) {
				h.log.WarnContext(ctx, "pgclaim: listen: notifications cannot reach this process; claim workers and schedulers poll", "error", err)
			}
			wait = time.Minute
		case pgerr.Refused(err):
			h.mode.Store(int32(Connecting))
			wait = min(time.Duration(failures)*time.Second, 30*time.Second)
			if failures == 1 {
				h.log.WarnContext(ctx, "pgclaim: listen: the server refuses a connection; polling meanwhile", "error", err)
			}
		default:
			// A session that was listening is reopened at once (its
			// subscribers look once it is back); then every second more,
			// up to 10 s, while the server does not answer.
			h.mode.Store(int32(Connecting))
			wait = min(time.Duration(failures-1)*time.Second, 10*time.Second)
			if failures == 1 {
				h.log.WarnContext(ctx, "pgclaim: listen: the listening connection ended; polling meanwhile, reconnecting", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// session opens one listening connection and reads its notifications until
// it fails or ctx ends; up reports whether it listened.
func (h *hub) session(ctx context.Context) (up bool, err error) {
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	c := pc.Hijack()
	defer lockcore.CloseConn(c)
	sctx, cancel := context.WithTimeout(ctx, pingBound)
	row, err := store.New(c).SessionSetup(sctx) // keepalives, no idle_session_timeout
	if err == nil && uint32(row.Pid) != c.PgConn().PID() {
		err = errPooler
	}
	if err == nil {
		_, err = c.Exec(sctx, "SELECT set_config('application_name', $1, false)", ApplicationName)
	}
	cancel()
	if err != nil {
		return false, err
	}
	defer func() {
		h.mu.Lock()
		clear(h.listened)
		h.interrupt = nil
		h.mu.Unlock()
	}()
	first := true
	quietSince := time.Now()
	for {
		// LISTEN the channels subscribed since the last look (before the
		// first wake-up: what is announced from then on arrives).
		h.mu.Lock()
		var add []string
		for ch := range h.subs {
			if !h.listened[ch] {
				add = append(add, ch)
			}
		}
		h.mu.Unlock()
		for _, ch := range add {
			lctx, cancel := context.WithTimeout(ctx, pingBound)
			_, err := c.Exec(lctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
			cancel()
			if err != nil {
				return !first, fmt.Errorf("LISTEN %s: %w", ch, err)
			}
			h.mu.Lock()
			h.listened[ch] = true
			h.mu.Unlock()
		}
		if first {
			first = false
			h.mode.Store(int32(Listening))
			h.everyone()
		} else {
			// Rows announced between a new subscriber's first look and
			// its LISTEN were not heard: it looks once more.
			for _, ch := range add {
				h.wakeChannel(ch)
			}
		}

		wctx, wcancel := context.WithDeadline(ctx, quietSince.Add(pingEvery))
		h.mu.Lock()
		pending := false
		for ch := range h.subs {
			if !h.listened[ch] {
				pending = true
			}
		}
		if pending {
			wcancel()
		} else {
			h.interrupt = wcancel
		}
		h.mu.Unlock()
		n, err := c.WaitForNotification(wctx)
		expired := wctx.Err() != nil
		wcancel()
		h.mu.Lock()
		h.interrupt = nil
		h.mu.Unlock()
		switch {
		case err == nil:
			h.deliver(n.Channel, n.Payload, nil)
			quietSince = time.Now()
			continue
		case ctx.Err() != nil:
			return true, ctx.Err()
		case !expired || c.IsClosed():
			return true, err
		}
		if time.Since(quietSince) < pingEvery {
			continue // interrupted for a new channel
		}
		pctx, pcancel := context.WithTimeout(ctx, pingBound)
		err = c.Ping(pctx)
		pcancel()
		if err != nil {
			return true, fmt.Errorf("ping: %w", err)
		}
		quietSince = time.Now()
	}
}
