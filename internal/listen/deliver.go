package listen

import "time"

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
