package listen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
