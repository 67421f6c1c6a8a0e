package server

import (
	"sync"
	"time"
)

// This file owns the per-node registries that connect FSM events to the
// requests and streams of this node: waitRegistry (waiting acquisitions) and
// sessionHub (Watch streams). Neither is replicated; both are rebuilt by the
// clients that reconnect.

// waitEntry is one waiting acquisition on this node.
type waitEntry struct {
	ch chan waitGrant
	// gone is closed when the queue entry is removed without a grant (a
	// CancelWait from another call or connection, or a purge): no grant
	// will come, so the waiting request must not wait on.
	gone   chan struct{}
	goneOK bool // gone is closed (guarded by waitRegistry.mu)
}

// waitGrant is what a waiting acquisition is told of its grant: the fence
// and the TTL its countdown runs with. The TTL is the queue entry's, which
// may differ from the request's when the owner waited again on an entry
// that outlived an earlier request (its cancel failed).
type waitGrant struct {
	fence uint64
	ttl   time.Duration
}

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
	w := &waitEntry{ch: make(chan waitGrant, 1), gone: make(chan struct{})}
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

func (r *waitRegistry) notify(ko keyOwner, g waitGrant) {
	r.mu.Lock()
	w := r.m[ko]
	r.mu.Unlock()
	if w != nil {
		select {
		case w.ch <- g:
		default:
		}
	}
}

// dequeued tells the request waiting on ko, if any, that its queue entry
// was removed without a grant.
func (r *waitRegistry) dequeued(ko keyOwner) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.m[ko]; w != nil && !w.goneOK {
		w.goneOK = true
		close(w.gone)
	}
}

// subscriber is one Watch stream. Its loss events wait in queue, under the
// hub's mutex, until the stream's goroutine takes them: the queue is
// allocated only when events arrive and grows up to max events. One more
// event sets overflow instead of being dropped in silence, and the stream
// ends with WATCH_BACKLOG_FULL so that its client reconnects (its own
// deadlines still end its leases in time).
type subscriber struct {
	wake     chan struct{} // capacity 1: a send means "events queued"
	max      int           // Config.MaxWatchBacklog
	queue    []event
	overflow bool
	keys     []string // watched keys (WatchRequest.keys)
	// pending holds the watched keys with a CHANGED event queued and not
	// taken yet: a key changed again meanwhile is not queued twice.
	pending map[string]struct{}
}

// evKeyChanged is a hub event, never made by the FSM: a watched key's
// grants may have changed (a CHANGED event of the Watch stream).
const evKeyChanged eventKind = -1

// sessionHub maps client sessions to their Watch streams, and watched keys
// to the streams that watch them.
type sessionHub struct {
	mu    sync.Mutex
	subs  map[string]map[*subscriber]struct{}
	byKey map[string]map[*subscriber]struct{}
}

// subscribe registers a Watch stream of session that queues at most
// backlog unread events, and watches keys. The stream hears of the losses
// this node applies from now on, and members apply the log at different
// times: a client that moves its stream to another member must check its
// grants once the new stream is up (the dlockd driver's recheckLost).
func (h *sessionHub) subscribe(session string, backlog int, keys ...string) *subscriber {
	sub := &subscriber{wake: make(chan struct{}, 1), max: backlog, keys: keys}
	h.mu.Lock()
	m := h.subs[session]
	if m == nil {
		m = make(map[*subscriber]struct{})
		h.subs[session] = m
	}
	m[sub] = struct{}{}
	for _, k := range keys {
		if h.byKey == nil {
			h.byKey = make(map[string]map[*subscriber]struct{})
		}
		km := h.byKey[k]
		if km == nil {
			km = make(map[*subscriber]struct{})
			h.byKey[k] = km
		}
		km[sub] = struct{}{}
	}
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
	for _, k := range sub.keys {
		if km := h.byKey[k]; km != nil {
			delete(km, sub)
			if len(km) == 0 {
				delete(h.byKey, k)
			}
		}
	}
	h.mu.Unlock()
}

// changed tells the streams watching any of keys (each once) that its
// grants may have changed; keys nil means every watched key (a restore).
// It never blocks, as lost.
func (h *sessionHub) changed(keys map[string]struct{}, all bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.byKey) == 0 {
		return
	}
	tell := func(k string, subs map[*subscriber]struct{}) {
		for sub := range subs {
			if _, queued := sub.pending[k]; queued {
				continue
			}
			if sub.pending == nil {
				sub.pending = make(map[string]struct{})
			}
			sub.pending[k] = struct{}{}
			h.enqueue(sub, event{kind: evKeyChanged, key: k})
		}
	}
	if all {
		for k, subs := range h.byKey {
			tell(k, subs)
		}
		return
	}
	for k := range keys {
		tell(k, h.byKey[k])
	}
}

// watching reports whether any stream watches a key.
func (h *sessionHub) watching() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byKey) > 0
}

// enqueue queues ev for sub, or marks it overflowed, and wakes it; with
// h.mu held.
func (h *sessionHub) enqueue(sub *subscriber, ev event) {
	if len(sub.queue) >= sub.max {
		sub.overflow = true
	} else {
		sub.queue = append(sub.queue, ev)
	}
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// count returns the number of sessions with a Watch stream.
func (h *sessionHub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// take returns the events queued for sub and empties its queue; overflow
// reports that an event found the queue full.
func (h *sessionHub) take(sub *subscriber) (evs []event, overflow bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	evs, sub.queue = sub.queue, nil
	sub.pending = nil
	return evs, sub.overflow
}

// lost tells the session's streams that its grant ended. It never blocks:
// the event is queued, or the stream's queue is full and marked overflowed.
func (h *sessionHub) lost(ev *event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[ev.session] {
		h.enqueue(sub, *ev)
	}
}
