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

// ApplicationName begins the listening session's application_name, as
// pg_stat_activity shows it: "pgclaim listener hostname:pid" (unless the
// pool's configuration names its sessions).
const ApplicationName = "pgclaim listener"

// appName is this process's listening sessions' application_name.
var appName = ApplicationName + " " + lockcore.ProcessName()

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

// Relay passes a notification on to another idle member of s's group, or,
// when none here is idle, to the other processes: the woken one found more
// work than it takes at once.
func (s *Sub) Relay() { s.h.relay(s) }

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
	peers     peers      // the other processes' listening sessions (peers.go)
	outbox    []outgoing // notifications to send from the listening session
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
		h = &hub{pool: pool, log: log, subs: map[string][]*Sub{}, next: map[string]int{}, listened: map[string]bool{}, peers: newPeers()}
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
	if s.one && len(h.group(s.channel, s.filter)) == 0 {
		h.send(s.channel, leaveNote+s.filter) // the other processes stop counting on this one
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

// deliver hands a notification from sender (a backend pid) on channel to
// the subscribers it concerns: each subscriber of payloads; each other
// subscriber whose filter accepts it; and, of each group, one idle member —
// when this process is among those the group's notifications from sender
// go to (peers.go), or among few enough.
func (h *hub) deliver(channel, payload string, sender uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.peers.heard(channel, payload, sender, time.Now()) {
		return // a peer's announcement, not work
	}
	subs := h.subs[channel]
	groups := map[string]bool{}
	for _, s := range subs {
		switch {
		case s.notes != nil:
			select {
			case s.notes <- payload:
			default:
				signal(s) // full: the subscriber looks at everything once
			}
		case s.filter != "" && s.filter != payload:
		case s.one:
			groups[s.filter] = true
		default:
			signal(s)
		}
	}
	for filter := range groups {
		if !h.peers.chosen(channel, filter, sender, time.Now()) {
			continue // another process takes it
		}
		if m := h.idleMember(channel, filter, nil); m != nil {
			signal(m)
			continue
		}
		// Everyone here is busy: a process with room takes it, unless
		// the notification was already passed on by one.
		if !h.peers.isPeer(channel, filter, sender) && h.peers.others(channel, filter, time.Now()) > 0 {
			h.send(channel, payload)
			continue
		}
		if m := h.anyMember(channel, filter); m != nil {
			signal(m) // it looks when it is done
		}
	}
}

// relay passes s's notification on (see Sub.Relay).
func (h *hub) relay(s *Sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.idleMember(s.channel, s.filter, s); m != nil {
		signal(m)
		return
	}
	if h.peers.others(s.channel, s.filter, time.Now()) > 0 {
		h.send(s.channel, s.filter)
	}
}

// idleMember returns an idle member of the group of channel and filter
// other than except, taking turns; nil when none is idle. h.mu is held.
func (h *hub) idleMember(channel, filter string, except *Sub) *Sub {
	members := h.group(channel, filter)
	key := channel + "\x00" + filter
	start := h.next[key]
	h.next[key] = start + 1
	for i := range members {
		if m := members[(start+i)%len(members)]; m != except && m.idle.Load() {
			return m
		}
	}
	return nil
}

// anyMember returns a member of the group, taking turns; nil when the group
// is empty. h.mu is held.
func (h *hub) anyMember(channel, filter string) *Sub {
	members := h.group(channel, filter)
	if len(members) == 0 {
		return nil
	}
	key := channel + "\x00" + filter
	start := h.next[key]
	h.next[key] = start + 1
	return members[start%len(members)]
}

// group returns the members of the group of channel and filter. h.mu is
// held.
func (h *hub) group(channel, filter string) []*Sub {
	var members []*Sub
	for _, s := range h.subs[channel] {
		if s.one && s.filter == filter {
			members = append(members, s)
		}
	}
	return members
}

// outgoing is a notification for the listening session to send.
type outgoing struct{ channel, payload string }

// send queues a notification for the listening session to send. h.mu is
// held.
func (h *hub) send(channel, payload string) {
	h.outbox = append(h.outbox, outgoing{channel, payload})
	if h.interrupt != nil {
		h.interrupt()
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
		case pgerr.ReadOnly(err):
			h.mode.Store(int32(Connecting))
			wait = min(time.Duration(failures)*time.Second, 10*time.Second)
			if failures == 1 {
				h.log.WarnContext(ctx, "pgclaim: listen: "+pgerr.ReadOnlyServer+"; polling meanwhile, reconnecting", "error", err)
			}
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
		_, err = c.Exec(sctx, lockcore.SetApplicationName, appName)
	}
	cancel()
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	h.peers.self = uint32(row.Pid)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		clear(h.listened)
		h.interrupt = nil
		h.peers.self = 0
		h.mu.Unlock()
	}()
	first := true
	quietSince := time.Now()
	announceAt := time.Now() // once listening: the others learn of this process
	for {
		if err := h.chores(ctx, c, &announceAt, first); err != nil {
			return !first, err
		}
		if first {
			first = false
			h.mode.Store(int32(Listening))
			h.everyone()
		}

		wctx, wcancel := context.WithDeadline(ctx, minTime(quietSince.Add(pingEvery), announceAt))
		h.mu.Lock()
		if h.pending() {
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
			h.deliver(n.Channel, n.Payload, n.PID)
			quietSince = time.Now()
			continue
		case ctx.Err() != nil:
			h.farewell(c)
			return true, ctx.Err()
		case !expired || c.IsClosed():
			return true, err
		}
		if time.Since(quietSince) < pingEvery {
			continue // interrupted for chores, or time to announce
		}
		pctx, pcancel := context.WithTimeout(ctx, pingBound)
		err = ping(pctx, c)
		pcancel()
		if err != nil {
			return true, fmt.Errorf("ping: %w", err)
		}
		quietSince = time.Now()
	}
}

// pending reports whether the session has chores: channels to LISTEN or
// UNLISTEN, notifications to send, peers to answer. h.mu is held.
func (h *hub) pending() bool {
	if len(h.outbox) > 0 || h.peers.reply {
		return true
	}
	for ch := range h.subs {
		if !h.listened[ch] {
			return true
		}
	}
	for ch := range h.listened {
		if len(h.subs[ch]) == 0 {
			return true
		}
	}
	return false
}

// chores brings the session's LISTENs in line with the subscriptions, sends
// the queued notifications, and announces this process to its peers when
// *announceAt has come (or a peer is to be answered). A subscriber whose
// channel was just LISTENed looks once more: rows announced between its
// first look and the LISTEN were not heard.
func (h *hub) chores(ctx context.Context, c *pgx.Conn, announceAt *time.Time, first bool) error {
	h.mu.Lock()
	var add, drop []string
	for ch := range h.subs {
		if !h.listened[ch] {
			add = append(add, ch)
		}
	}
	for ch := range h.listened {
		if len(h.subs[ch]) == 0 {
			drop = append(drop, ch)
		}
	}
	out := h.outbox
	h.outbox = nil
	h.mu.Unlock()
	for _, ch := range add {
		if err := h.exec(ctx, c, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("LISTEN %s: %w", ch, err)
		}
		h.mu.Lock()
		h.listened[ch] = true
		h.mu.Unlock()
		if !first {
			h.wakeChannel(ch)
		}
	}
	for _, ch := range drop {
		if err := h.exec(ctx, c, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("UNLISTEN %s: %w", ch, err)
		}
		h.mu.Lock()
		delete(h.listened, ch)
		h.mu.Unlock()
	}
	h.mu.Lock()
	// Every group is announced when this session starts listening to a
	// channel and when a peer unknown so far announced itself; then every
	// announceEvery the groups that have peers, which would forget this
	// process otherwise (a process alone on its table stays quiet: a peer
	// arriving announces itself and is answered).
	if now := time.Now(); !now.Before(*announceAt) || h.peers.reply || len(add) > 0 {
		all := h.peers.reply || len(add) > 0
		for ch, filters := range groups(h.subs) {
			for _, f := range filters {
				if all || h.peers.others(ch, f, now) > 0 {
					out = append(out, outgoing{ch, memberNote + f})
				}
			}
		}
		h.peers.reply = false
		*announceAt = now.Add(announceEvery)
	}
	h.mu.Unlock()
	return h.notify(ctx, c, out)
}

// notify sends out from the session, in one statement.
func (h *hub) notify(ctx context.Context, c *pgx.Conn, out []outgoing) error {
	if len(out) == 0 {
		return nil
	}
	chans, payloads := make([]string, len(out)), make([]string, len(out))
	for i, o := range out {
		chans[i], payloads[i] = o.channel, o.payload
	}
	return h.exec(ctx, c, "SELECT pg_notify(t.c, t.p) FROM unnest($1::text[], $2::text[]) AS t(c, p)", chans, payloads)
}

// farewell tells the peers, as the session ends, that this process's
// groups end with it.
func (h *hub) farewell(c *pgx.Conn) {
	h.mu.Lock()
	var out []outgoing
	for ch, filters := range groups(h.subs) {
		for _, f := range filters {
			out = append(out, outgoing{ch, leaveNote + f})
		}
	}
	out = append(out, h.outbox...)
	h.outbox = nil
	h.mu.Unlock()
	_ = h.notify(context.Background(), c, out)
}

// exec runs one statement on the session within pingBound.
func (h *hub) exec(ctx context.Context, c *pgx.Conn, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, pingBound)
	defer cancel()
	_, err := c.Exec(ctx, sql, args...)
	return err
}

// ping checks the session with a bare Sync message, which the server
// answers without a transaction: listening costs the server's transaction
// count nothing while nothing is announced (pgx's Ping runs an empty
// statement, one transaction).
func ping(ctx context.Context, c *pgx.Conn) error {
	p := c.PgConn().StartPipeline(ctx)
	if err := p.Sync(); err != nil {
		_ = p.Close()
		return err
	}
	if _, err := p.GetResults(); err != nil {
		_ = p.Close()
		return err
	}
	return p.Close()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
