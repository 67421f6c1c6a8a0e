package server

import (
	"container/heap"
	"sync"
	"time"
)

// lease is the leader's in-memory countdown of one grant. Deadlines are
// read from the monotonic clock of this process and never leave it.
//
// It is kept small (64 bytes) because there is one per held key: the
// deadline is in nanoseconds since the clock's epoch, and strings are shared
// with the FSM.
type lease struct {
	key      string
	owner    string
	fence    uint64
	ttl      time.Duration
	deadline int64 // nanoseconds since leaseClock.epoch (monotonic)
	idx      int32 // index in the heap, -1 when not in it
	expiring bool  // an expire entry has been proposed
}

type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = int32(i)
	h[j].idx = int32(j)
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.idx = int32(len(*h))
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	l.idx = -1
	return l
}

// leaseClock keeps a countdown per held key, fed by the FSM's events on every
// node; only the leader's is used to expire and renew. A restored table, and
// every new term of leadership, restart each countdown at its full TTL.
type leaseClock struct {
	now   func() time.Time
	epoch time.Time // monotonic origin of deadlines

	mu    sync.Mutex
	byKey map[string]*lease
	heap  leaseHeap
	wake  chan struct{} // buffered 1: the earliest deadline may have moved
}

func newLeaseClock(now func() time.Time) *leaseClock {
	return &leaseClock{now: now, epoch: now(), byKey: make(map[string]*lease), wake: make(chan struct{}, 1)}
}

// at converts a time to a deadline; toTime converts back.
func (c *leaseClock) at(t time.Time) int64     { return int64(t.Sub(c.epoch)) }
func (c *leaseClock) toTime(d int64) time.Time { return c.epoch.Add(time.Duration(d)) }

func (c *leaseClock) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// apply updates the countdowns from FSM events.
func (c *leaseClock) apply(evs []event) {
	now := c.at(c.now())
	poke := false
	c.mu.Lock()
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evGranted:
			if old := c.byKey[ev.key]; old != nil && old.idx >= 0 {
				heap.Remove(&c.heap, int(old.idx))
			}
			l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, deadline: now + int64(ev.ttl)}
			c.byKey[ev.key] = l
			heap.Push(&c.heap, l)
			poke = poke || l.idx == 0
		case evRemoved:
			if l := c.byKey[ev.key]; l != nil && l.owner == ev.owner {
				if l.idx >= 0 {
					heap.Remove(&c.heap, int(l.idx))
				}
				delete(c.byKey, ev.key)
			}
		case evTTL:
			if l := c.byKey[ev.key]; l != nil && l.owner == ev.owner {
				l.ttl = ev.ttl
				l.deadline = now + int64(ev.ttl)
				if l.idx >= 0 {
					heap.Fix(&c.heap, int(l.idx))
				}
				poke = true
			}
		}
	}
	c.mu.Unlock()
	if poke {
		c.poke()
	}
}

// reset replaces every countdown with holders', each restarted at its full
// TTL from now.
func (c *leaseClock) reset(holders []event) {
	now := c.at(c.now())
	c.mu.Lock()
	c.byKey = make(map[string]*lease, len(holders))
	c.heap = make(leaseHeap, 0, len(holders))
	for _, ev := range holders {
		l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, deadline: now + int64(ev.ttl), idx: int32(len(c.heap))}
		c.byKey[ev.key] = l
		c.heap = append(c.heap, l)
	}
	heap.Init(&c.heap)
	c.mu.Unlock()
	c.poke()
}

// restartAll restarts every countdown at its full TTL from now (a new term
// of leadership) and forgets proposed expiries.
func (c *leaseClock) restartAll() {
	now := c.at(c.now())
	c.mu.Lock()
	c.heap = c.heap[:0]
	for _, l := range c.byKey {
		l.deadline = now + int64(l.ttl)
		l.expiring = false
		l.idx = int32(len(c.heap))
		c.heap = append(c.heap, l)
	}
	heap.Init(&c.heap)
	c.mu.Unlock()
	c.poke()
}

// renewOutcome is the clock's answer to one renewal.
type renewOutcome int

const (
	renewOK       renewOutcome = iota
	renewLost                  // not the holder, or its countdown already ran out
	renewNeedsLog              // a different TTL: must go through the log
)

// renew moves the deadline of owner's grant on key to now + its TTL, when
// owner holds key and its countdown has not run out. ttl 0 keeps the TTL.
func (c *leaseClock) renew(key, owner string, ttl time.Duration, t time.Time) renewOutcome {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey[key]
	if l == nil || l.owner != owner || l.expiring || now >= l.deadline {
		return renewLost
	}
	if ttl != 0 && ttl != l.ttl {
		return renewNeedsLog
	}
	l.deadline = now + int64(l.ttl)
	if l.idx >= 0 {
		heap.Fix(&c.heap, int(l.idx))
	}
	return renewOK
}

// remaining returns the time left on key's countdown, if owner-agnostic
// state is known.
func (c *leaseClock) remaining(key string, fence uint64) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey[key]
	if l == nil || l.fence != fence {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// takeExpired marks up to limit run-out countdowns as expiring and returns
// them, and the time of the next deadline (zero when none).
func (c *leaseClock) takeExpired(t time.Time, limit int) ([]keyOwner, time.Time) {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []keyOwner
	for len(c.heap) > 0 && len(out) < limit {
		l := c.heap[0]
		if now < l.deadline {
			return out, c.toTime(l.deadline)
		}
		heap.Pop(&c.heap)
		l.expiring = true
		out = append(out, keyOwner{key: l.key, owner: l.owner})
	}
	if len(c.heap) > 0 {
		return out, c.toTime(c.heap[0].deadline)
	}
	return out, time.Time{}
}

// retry puts back countdowns whose expire entry failed, to be tried again
// after delay.
func (c *leaseClock) retry(pairs []keyOwner, delay time.Duration) {
	at := c.at(c.now().Add(delay))
	c.mu.Lock()
	for _, p := range pairs {
		if l := c.byKey[p.key]; l != nil && l.owner == p.owner && l.expiring {
			l.expiring = false
			l.deadline = at
			if l.idx < 0 {
				heap.Push(&c.heap, l)
			} else {
				heap.Fix(&c.heap, int(l.idx))
			}
		}
	}
	c.mu.Unlock()
	c.poke()
}

// size returns the number of countdowns.
func (c *leaseClock) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}
