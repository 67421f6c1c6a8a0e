package server

import "sync"

// This file owns the per-node registries that connect FSM events to the
// requests and streams of this node: waitRegistry (waiting acquisitions) and
// sessionHub (Watch streams). Neither is replicated; both are rebuilt by the
// clients that reconnect.

// waitEntry is one waiting acquisition on this node.
type waitEntry struct{ ch chan uint64 }

// waitRegistry maps the queue entries of clients connected to this node to
// their waiting request.
type waitRegistry struct {
	mu sync.Mutex
	m  map[keyOwner]*waitEntry
}

func (r *waitRegistry) add(ko keyOwner) (*waitEntry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[ko]; dup {
		return nil, false
	}
	w := &waitEntry{ch: make(chan uint64, 1)}
	r.m[ko] = w
	return w, true
}

func (r *waitRegistry) remove(ko keyOwner, w *waitEntry) {
	r.mu.Lock()
	if r.m[ko] == w {
		delete(r.m, ko)
	}
	r.mu.Unlock()
}

func (r *waitRegistry) has(ko keyOwner) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[ko]
	return ok
}

func (r *waitRegistry) notify(ko keyOwner, fence uint64) {
	r.mu.Lock()
	w := r.m[ko]
	r.mu.Unlock()
	if w != nil {
		select {
		case w.ch <- fence:
		default:
		}
	}
}

// subscriber is one Watch stream.
type subscriber struct{ ch chan event }

// sessionHub maps client sessions to their Watch streams.
type sessionHub struct {
	mu   sync.Mutex
	subs map[string]map[*subscriber]struct{}
}

func (h *sessionHub) subscribe(session string) *subscriber {
	sub := &subscriber{ch: make(chan event, 1024)}
	h.mu.Lock()
	m := h.subs[session]
	if m == nil {
		m = make(map[*subscriber]struct{})
		h.subs[session] = m
	}
	m[sub] = struct{}{}
	h.mu.Unlock()
	return sub
}

func (h *sessionHub) unsubscribe(session string, sub *subscriber) {
	h.mu.Lock()
	if m := h.subs[session]; m != nil {
		delete(m, sub)
		if len(m) == 0 {
			delete(h.subs, session)
		}
	}
	h.mu.Unlock()
}

// count returns the number of sessions with a Watch stream.
func (h *sessionHub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// lost tells the session's streams that its grant ended. A full stream
// drops the event: the client's own deadline still ends the lease.
func (h *sessionHub) lost(ev *event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[ev.session] {
		select {
		case sub.ch <- *ev:
		default:
		}
	}
}
