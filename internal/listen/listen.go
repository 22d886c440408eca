package listen

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

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
