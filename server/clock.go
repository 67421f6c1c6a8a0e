package server

import (
	"container/heap"
	"sync"
	"time"
)

// lease is the leader's in-memory countdown of one grant, or of one key's
// lock-delay. Deadlines are read from the monotonic clock of this process
// and never leave it.
//
// There is one per held key, so it stays small: deadlines are nanoseconds
// since the clock's epoch, and strings are shared with the FSM.
type lease struct {
	key      string
	owner    string // "" for a lock-delay
	fence    uint64
	ttl      time.Duration // a lock-delay: the delay
	restart  time.Duration // what a restarted countdown runs with: the grant's longest TTL
	version  uint64        // the FSM version this countdown runs for
	deadline int64         // nanoseconds since leaseClock.epoch (monotonic)
	claimBy  int64         // a handed-over grant not claimed yet: its claim deadline; 0 otherwise
	idx      int32         // index in the heap, -1 when not in it
	expiring bool          // an entry that ends it has been proposed
	delay    bool          // a lock-delay countdown
}

// due is when the countdown next needs the leader: its deadline, or its
// claim deadline when that comes first.
func (l *lease) due() int64 {
	if l.claimBy != 0 && l.claimBy < l.deadline {
		return l.claimBy
	}
	return l.deadline
}

type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].due() < h[j].due() }
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

// leaseClock keeps a countdown per held key and per key in a lock-delay,
// fed by the FSM's events on every node; only the leader's is used to
// expire, to release unclaimed handovers, to end lock-delays and to renew.
// A restored table, and every new term of leadership, restart each
// countdown at its full TTL (each lock-delay at its full delay) and forget
// pending claims.
type leaseClock struct {
	now         func() time.Time
	epoch       time.Time     // monotonic origin of deadlines
	claimWindow time.Duration // a handed-over grant must be claimed within this; 0: no claims

	mu    sync.Mutex
	byKey map[string]*lease
	heap  leaseHeap
	wake  chan struct{} // buffered 1: the earliest deadline may have moved
}

func newLeaseClock(now func() time.Time, claimWindow time.Duration) *leaseClock {
	return &leaseClock{now: now, epoch: now(), claimWindow: claimWindow, byKey: make(map[string]*lease), wake: make(chan struct{}, 1)}
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

// put replaces key's countdown with l, with c.mu held.
func (c *leaseClock) put(l *lease) {
	if old := c.byKey[l.key]; old != nil && old.idx >= 0 {
		heap.Remove(&c.heap, int(old.idx))
	}
	c.byKey[l.key] = l
	heap.Push(&c.heap, l)
}

// drop removes l, with c.mu held.
func (c *leaseClock) drop(l *lease) {
	if l.idx >= 0 {
		heap.Remove(&c.heap, int(l.idx))
	}
	delete(c.byKey, l.key)
}

// fix puts l back in order after its deadlines moved, with c.mu held.
func (c *leaseClock) fix(l *lease) {
	if l.idx >= 0 {
		heap.Fix(&c.heap, int(l.idx))
	} else {
		heap.Push(&c.heap, l)
	}
}

// apply updates the countdowns from FSM events.
func (c *leaseClock) apply(evs []event) {
	now := c.at(c.now())
	c.mu.Lock()
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evGranted:
			l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, restart: max(ev.restartTTL, ev.ttl), version: ev.version, deadline: now + int64(ev.ttl)}
			if ev.handoff && c.claimWindow > 0 {
				l.claimBy = now + int64(c.claimWindow)
			}
			c.put(l)
		case evRemoved:
			if l := c.byKey[ev.key]; l != nil && !l.delay && l.owner == ev.owner {
				c.drop(l)
			}
		case evTTL:
			// A TTL change or a retried acquire by the holder, through the
			// log: the countdown restarts with the entry's version, which
			// makes any expiry proposed for an older version stale. The
			// holder asked, so a pending claim is made too. A deadline
			// never moves earlier: a shorter TTL must not bring forward an
			// end already acknowledged.
			if l := c.byKey[ev.key]; l != nil && !l.delay && l.owner == ev.owner {
				l.ttl = ev.ttl
				l.restart = max(ev.restartTTL, ev.ttl)
				l.version = ev.version
				l.deadline = max(l.deadline, now+int64(ev.ttl))
				l.claimBy = 0
				l.expiring = false
				c.fix(l)
			}
		case evDelayed:
			c.put(&lease{key: ev.key, ttl: ev.ttl, version: ev.version, deadline: now + int64(ev.ttl), delay: true})
		case evDelayEnded:
			if l := c.byKey[ev.key]; l != nil && l.delay && l.version == ev.version {
				c.drop(l)
			}
		}
	}
	c.mu.Unlock()
	c.poke()
}

// reset replaces every countdown with state's (evGranted and evDelayed
// events), each restarted in full from now.
func (c *leaseClock) reset(state []event) {
	now := c.at(c.now())
	c.mu.Lock()
	c.byKey = make(map[string]*lease, len(state))
	c.heap = make(leaseHeap, 0, len(state))
	for _, ev := range state {
		restart := max(ev.restartTTL, ev.ttl)
		l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, restart: restart, version: ev.version, deadline: now + int64(restart), idx: int32(len(c.heap)), delay: ev.kind == evDelayed}
		c.byKey[ev.key] = l
		c.heap = append(c.heap, l)
	}
	heap.Init(&c.heap)
	c.mu.Unlock()
	c.poke()
}

// restartAll restarts every countdown in full from now (a new term of
// leadership), forgets proposed ends and pending claims: a new leader cannot
// know whether a claim reached its predecessor, so it treats every grant as
// claimed (late, never early).
func (c *leaseClock) restartAll() {
	now := c.at(c.now())
	c.mu.Lock()
	c.heap = c.heap[:0]
	for _, l := range c.byKey {
		l.deadline = now + int64(max(l.restart, l.ttl))
		l.claimBy = 0
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
	renewLost                  // not the holder, its countdown or claim window ran out, or an end was proposed
	renewNeedsLog              // a different TTL: must go through the log
)

// renew moves the deadline of owner's grant on key to now + its TTL, and
// claims a handed-over grant, when owner holds key and neither its countdown
// nor its claim window has run out. ttl 0 keeps the TTL.
func (c *leaseClock) renew(key, owner string, ttl time.Duration, t time.Time) renewOutcome {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey[key]
	if l == nil || l.delay || l.owner != owner || l.expiring || now >= l.deadline || (l.claimBy != 0 && now >= l.claimBy) {
		return renewLost
	}
	if ttl != 0 && ttl != l.ttl {
		return renewNeedsLog
	}
	l.deadline = max(l.deadline, now+int64(l.ttl)) // never earlier than an end already acknowledged
	l.claimBy = 0
	c.fix(l)
	return renewOK
}

// remaining returns the time left on the countdown of key's grant with
// fence, if this node has it.
func (c *leaseClock) remaining(key string, fence uint64) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey[key]
	if l == nil || l.delay || l.fence != fence {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// delayRemaining returns the time left on key's lock-delay, if one runs.
func (c *leaseClock) delayRemaining(key string) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey[key]
	if l == nil || !l.delay {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// fireKind is what the leader must propose for a countdown that ran out.
type fireKind int

const (
	fireExpire    fireKind = iota // the grant's countdown ran out: opExpire
	fireUnclaimed                 // the handed-over grant was not claimed in time: opUnclaimed
	fireEndDelay                  // the key's lock-delay ran out: opEndDelay
)

// fired is one countdown that ran out.
type fired struct {
	kind fireKind
	x    expiry // key, owner ("" for a delay) and version
}

// takeExpired marks up to limit run-out countdowns as expiring and returns
// them, and the time of the next deadline (zero when none).
func (c *leaseClock) takeExpired(t time.Time, limit int) ([]fired, time.Time) {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []fired
	for len(c.heap) > 0 && len(out) < limit {
		l := c.heap[0]
		if now < l.due() {
			return out, c.toTime(l.due())
		}
		heap.Pop(&c.heap)
		l.expiring = true
		f := fired{kind: fireExpire, x: expiry{key: l.key, owner: l.owner, version: l.version}}
		switch {
		case l.delay:
			f.kind = fireEndDelay
		case now < l.deadline: // the claim deadline came first
			f.kind = fireUnclaimed
		}
		out = append(out, f)
	}
	if len(c.heap) > 0 {
		return out, c.toTime(c.heap[0].due())
	}
	return out, time.Time{}
}

// retry puts back countdowns whose entry failed, to be tried again after
// delay.
func (c *leaseClock) retry(fs []fired, delay time.Duration) {
	at := c.at(c.now().Add(delay))
	c.mu.Lock()
	for _, f := range fs {
		if l := c.byKey[f.x.key]; l != nil && l.owner == f.x.owner && l.version == f.x.version && l.expiring {
			l.expiring = false
			l.deadline = max(l.deadline, at)
			if l.claimBy != 0 {
				l.claimBy = max(l.claimBy, at)
			}
			c.fix(l)
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
