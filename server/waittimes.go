package server

import (
	"sync"
	"time"
)

// waitTimes keeps, on every node, when each queue entry was applied here:
// the dashboard's "waited for" and the leader's dlockd_acquire_wait_seconds
// (queue entry to grant). The FSM keeps no time (its Apply reads no clock),
// so this lives beside it, fed by its events (evQueued, evDequeued,
// evGranted of a handover) from the FSM goroutine. Its size is the number
// of queue entries, which Config.MaxWaiters bounds.
type waitTimes struct {
	// replayTo is the last log index when the server started (set before
	// Raft runs): an entry up to it is replayed, its time unknown.
	replayTo uint64

	mu sync.Mutex
	m  map[keyOwner]waitStamp
}

// waitStamp is when one queue entry was applied on this node. restored: it
// came from a snapshot or a log entry replayed after a restart, so at is
// then and the entry waits since before.
type waitStamp struct {
	at       time.Time
	restored bool
}

// apply records the queue entries evs add and removes those they end.
// Each handover to a queued waiter is observed in wait (if not nil) as the
// entry's wait, when leader.
func (w *waitTimes) apply(evs []event, now time.Time, leader bool, wait func(time.Duration)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evQueued:
			if w.m == nil {
				w.m = make(map[keyOwner]waitStamp)
			}
			w.m[keyOwner{ev.key, ev.owner}] = waitStamp{at: now, restored: ev.version <= w.replayTo}
		case evDequeued:
			delete(w.m, keyOwner{ev.key, ev.owner})
		case evGranted:
			if !ev.handoff {
				continue
			}
			ko := keyOwner{ev.key, ev.owner}
			if st, ok := w.m[ko]; ok {
				if leader && wait != nil && !st.restored {
					wait(now.Sub(st.at))
				}
				delete(w.m, ko)
			}
		}
	}
}

// reset forgets every stamp and stamps entries (a restored table's queue
// entries) as restored at now.
func (w *waitTimes) reset(entries []queuedEntry, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.m = make(map[keyOwner]waitStamp, len(entries))
	for _, e := range entries {
		w.m[e.ko] = waitStamp{at: now, restored: true}
	}
}

// since returns when owner's queue entry on key was applied here, if known.
func (w *waitTimes) since(key, owner string) (waitStamp, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.m[keyOwner{key, owner}]
	return st, ok
}
