package listen

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
	"time"
)

// Every process whose workers claim a table hears every announcement of its
// rows. Were each to claim at once, one row inserted would cost a claim
// statement in every process, all but one finding nothing. So the listening
// sessions of the processes with a group on a channel (the workers of one
// table and state) know one another: each announces itself on the channel
// when it starts listening, every announceEvery after, and when its group
// ends; and a notification from a writer goes to the chosenPerNote
// processes that rank highest for that writer's backend pid (rendezvous
// hashing: every process ranks them alike, and when one comes or goes only
// the writers it ranked first move). A chosen process with no idle member
// passes the notification on from its own session, which ranks the others
// anew; a worker that claims a full batch passes it on the same way. A
// process that has not yet heard of the others, or has heard of few, takes
// every notification. What this can cost is latency, never a row: a
// notification whose chosen processes died (their sessions are forgotten
// peerTTL after their last announcement) waits for the workers' poll.
const (
	memberNote    = "pgclaim:member "
	leaveNote     = "pgclaim:leave "
	announceEvery = 10 * time.Second
	peerTTL       = 3 * announceEvery
	chosenPerNote = 2
)

// peers is what a hub knows of the other processes' sessions. Its methods
// run with the hub's mutex held.
type peers struct {
	self uint32                          // this session's backend pid; 0 while not connected
	seen map[string]map[uint32]time.Time // group key → peer pid → last heard
	// reply: a peer unknown so far announced itself; announce soon, so it
	// learns of this process too.
	reply bool
}

func newPeers() peers { return peers{seen: map[string]map[uint32]time.Time{}} }

func groupKey(channel, filter string) string { return channel + "\x00" + filter }

// heard records payload from sender if it is a peer's announcement, and
// reports whether it was.
func (p *peers) heard(channel, payload string, sender uint32, now time.Time) bool {
	switch {
	case strings.HasPrefix(payload, memberNote):
		if sender == p.self {
			return true
		}
		k := groupKey(channel, strings.TrimPrefix(payload, memberNote))
		m := p.seen[k]
		if m == nil {
			m = map[uint32]time.Time{}
			p.seen[k] = m
		}
		if _, known := m[sender]; !known {
			p.reply = true
		}
		m[sender] = now
		return true
	case strings.HasPrefix(payload, leaveNote):
		delete(p.seen[groupKey(channel, strings.TrimPrefix(payload, leaveNote))], sender)
		return true
	}
	return false
}

// live returns the peers heard on the group within peerTTL, forgetting the
// others.
func (p *peers) live(channel, filter string, now time.Time) []uint32 {
	m := p.seen[groupKey(channel, filter)]
	out := make([]uint32, 0, len(m))
	for pid, at := range m {
		if now.Sub(at) > peerTTL {
			delete(m, pid)
			continue
		}
		if pid != p.self {
			out = append(out, pid)
		}
	}
	return out
}

// others returns how many peers the group has.
func (p *peers) others(channel, filter string, now time.Time) int {
	return len(p.live(channel, filter, now))
}

// isPeer reports whether sender is a peer's session of the group: the
// notification was passed on.
func (p *peers) isPeer(channel, filter string, sender uint32) bool {
	_, ok := p.seen[groupKey(channel, filter)][sender]
	return ok || sender == p.self
}

// chosen reports whether this process is among the chosenPerNote that the
// group's notifications from sender go to.
func (p *peers) chosen(channel, filter string, sender uint32, now time.Time) bool {
	switch {
	case p.self == 0:
		return true
	case sender == p.self:
		return false // passed on from here: for the others
	}
	mine := rank(sender, p.self)
	higher, n := 0, 1
	for _, pid := range p.live(channel, filter, now) {
		if pid == sender {
			continue
		}
		n++
		if r := rank(sender, pid); r > mine || r == mine && pid > p.self {
			higher++
		}
	}
	return n <= chosenPerNote || higher < chosenPerNote
}

// rank is the rendezvous score of the session pid for notifications from
// sender.
func rank(sender, pid uint32) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], sender)
	binary.BigEndian.PutUint32(b[4:], pid)
	h := fnv.New64a()
	_, _ = h.Write(b[:])
	return h.Sum64()
}

// groups returns the filters of the groups subscribed on each channel of
// subs: what this process announces itself for.
func groups(subs map[string][]*Sub) map[string][]string {
	out := map[string][]string{}
	for ch, list := range subs {
		seen := map[string]bool{}
		for _, s := range list {
			if s.one && !seen[s.filter] {
				seen[s.filter] = true
				out[ch] = append(out[ch], s.filter)
			}
		}
	}
	return out
}
