package lockcore

// Watching a session that holds locks: its liveness, the validity of each
// lock on it, and the report of their loss.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// PingEvery is how much quiet on an advisory lock's session makes its
// watch ping (WatchConfig.Every for the locks of gate's Once and Exclusive
// and of the scheduler).
const PingEvery = time.Second

// SessionValidity is how long one confirmation of an advisory lock's session
// (the statement that took the lock, a statement answered on it, or a ping
// answered) keeps a run under the lock going, counted from when it was
// sent: a session that has not answered for that long is counted lost and
// its run cancelled, since a network that went silent cannot say whether
// the server still holds the lock. With pings after PingEvery of quiet, a
// silent network is found 2–3 s after it fell silent.
//
// The margin: the server frees the lock of a client it no longer hears from
// no sooner than its TCP keepalive gives up on it, 11 s after the last
// packet it received (SessionSetup sets tcp_keepalives_idle 5 s, interval
// 2 s, count 3); a quiet connection exchanges a packet at least every 5 s,
// so that is at least 6 s after the network fell silent, and the run is
// cancelled at least 3 s before another instance can take the lock on the
// same server. After a failover the promoted server holds no lock at all
// and a run elsewhere may start as soon as it accepts connections; the
// fencing token is what refuses the old run's writes there.
const SessionValidity = 3 * time.Second

// watch is one lock's watch on a shared session.
type watch struct {
	valid  *Validity // nil: confirmed by pings only
	every  time.Duration
	onLost func(error)
	k      *Keeper
	once   sync.Once // lose or stop, whichever comes first
	taken  sync.Once // Stop takes the session once
	lapse  *time.Timer
}

func (w *watch) lose(err error) {
	w.once.Do(func() {
		if w.lapse != nil {
			w.lapse.Stop()
		}
		w.k.err = err
		if w.onLost != nil {
			w.onLost(err)
		}
		close(w.k.done)
	})
}

// WatchConfig configures Session.Watch.
type WatchConfig struct {
	// After is how long from now the watch starts (0: at once). A lock
	// released sooner costs no goroutine; a session lost meanwhile is seen
	// the moment the watch starts, since the read returns what the server
	// sent.
	After time.Duration
	// Every is how much quiet on the socket makes the watch ping.
	Every time.Duration
	// Validity, when set, is confirmed by every ping that succeeds (each
	// ping bounded by it), and the session counts as lost (ErrExpired) when
	// it runs out. Without it a ping is bounded by Every.
	Validity *Validity
}

// Watch registers a lock held on s and hands s back (as Put does): while
// nobody runs statements on s, one goroutine watches it for every lock held
// on it, blocking on the connection's socket (pgconn's
// WaitForNotification): a terminated backend or a server shutdown sends a
// FATAL error and closes the socket, which ends the read at once. After
// c.Every of silence (the shortest of the locks' settings) it pings, to
// find a dead network. Every ping and every statement answered on s
// confirms c.Validity. When the session is lost, onLost is called once,
// from the watching goroutine, for each lock on it. A lock whose validity
// runs out unconfirmed is lost (ErrExpired): on a shared session (Share)
// that lock alone, whose holder still releases it on the session (a slow
// answer is not a lost session: see SessionBound); on a session of its own
// the session ends, since a session that does not answer may have lost
// every lock.
//
// The returned Keeper's Stop unregisters the lock and takes s again for
// statements (hand it back with Put or Close); Done is closed when the
// session is lost or the watch stopped. ctx is not used for cancellation:
// the watch ends by Stop or with the session. c.After is ignored: the
// session is watched anyway while it holds locks.
func (s *Session) Watch(_ context.Context, c WatchConfig, onLost func(error)) *Keeper {
	k := s.register(c, onLost)
	s.c.give()
	return k
}

// register is Watch without handing s back: the caller still uses it.
func (s *Session) register(c WatchConfig, onLost func(error)) *Keeper {
	w := &watch{valid: c.Validity, every: c.Every, onLost: onLost, k: &Keeper{done: make(chan struct{})}}
	stop := func(take bool) error {
		s.c.mu.Lock()
		_, on := s.watches[w]
		delete(s.watches, w)
		if w.lapse != nil {
			w.lapse.Stop()
		}
		s.c.mu.Unlock()
		first := false
		w.taken.Do(func() { first = true })
		if !first {
			<-w.k.done
			return w.k.err
		}
		if take {
			_ = s.c.take(context.Background())
		}
		if on {
			w.once.Do(func() { close(w.k.done) })
		}
		<-w.k.done
		return w.k.err
	}
	w.k.stopFn = func() error { return stop(true) }
	w.k.detachFn = func() error { return stop(false) }
	s.c.mu.Lock()
	ended := s.ended
	if ended == nil {
		s.watches[w] = struct{}{}
		if s.c.shared && c.Validity != nil {
			s.armLapse(w)
		}
	}
	s.c.mu.Unlock()
	if ended != nil {
		w.lose(ended)
	}
	return w.k
}

// armLapse makes w lost with ErrExpired once its validity runs out
// unconfirmed, whether or not the session is being watched or used
// meanwhile; called with c.mu held.
func (s *Session) armLapse(w *watch) {
	w.lapse = time.AfterFunc(time.Until(w.valid.Until()), func() {
		s.c.mu.Lock()
		if left := time.Until(w.valid.Until()); left > 0 {
			if _, on := s.watches[w]; on {
				w.lapse.Reset(left)
			}
			s.c.mu.Unlock()
			return
		}
		_, on := s.watches[w]
		delete(s.watches, w)
		s.c.mu.Unlock()
		if on {
			w.lose(ErrExpired)
		}
	})
}

// watchIdle starts the watch of an idle session holding locks; called with
// c.mu held.
func (s *Session) watchIdle() *Keeper {
	return keep(context.Background(), 0, func(stop context.Context) error {
		pc := s.Conn.PgConn()
		for {
			every, until := PingEvery, time.Time{}
			s.c.mu.Lock()
			for w := range s.watches {
				if w.every > 0 {
					every = min(every, w.every)
				}
				if w.valid != nil && !s.c.shared {
					if u := w.valid.Until(); until.IsZero() || u.Before(until) {
						until = u
					}
				}
			}
			s.c.mu.Unlock()
			wait := every
			if !until.IsZero() {
				if wait = min(wait, time.Until(until)); wait <= 0 {
					return ErrExpired
				}
			}
			wctx, wcancel := context.WithTimeout(stop, wait)
			err := pc.WaitForNotification(wctx)
			quiet := wctx.Err() != nil
			wcancel()
			if stop.Err() != nil && !pc.IsClosed() {
				return nil // stopped
			}
			if err == nil {
				continue // a notification; nothing here listens
			}
			if quiet && !pc.IsClosed() {
				sent := time.Now()
				switch {
				case s.c.shared:
					until = sent.Add(SessionBound)
				case until.IsZero():
					until = sent.Add(every)
				}
				pctx, pcancel := context.WithDeadline(context.Background(), until)
				err = pc.Ping(pctx)
				pcancel()
				if err == nil {
					s.confirm(sent)
					continue
				}
				if !time.Now().Before(until) {
					if s.c.shared {
						return fmt.Errorf("no answer to a ping for %v", SessionBound)
					}
					// No answer before a validity ran out: a silent
					// network, or a server too slow to count on.
					return ErrExpired
				}
			}
			return err
		}
	}, func(err error) { s.end(err) })
}

// confirm extends the validity of every lock on s after an answer to a
// statement sent at sent.
func (s *Session) confirm(sent time.Time) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for w := range s.watches {
		if w.valid != nil {
			w.valid.Confirm(sent)
		}
	}
}
