package server

import (
	"container/heap"
	"math"
	"sort"
	"sync"
	"time"
)

// lease is the leader's in-memory countdown of one grant, or of one key's
// lock-delay. Deadlines are read from the monotonic clock of this process
// and never leave it.
//
// There is one per held key, so it stays small (112 bytes: keep it so when
// adding a field; TestMemory_HeapPerLease bounds it): deadlines are
// nanoseconds since the clock's epoch, strings are shared with the FSM,
// and the attributes fixed at its making are bits of attrs.
type lease struct {
	key      string
	owner    string // "" for a lock-delay
	fence    uint64
	ttl      time.Duration // a lock-delay: the delay
	restart  time.Duration // what a restarted countdown runs with: the grant's longest TTL
	version  uint64        // the FSM version this countdown runs for
	deadline int64         // nanoseconds since leaseClock.epoch (monotonic)
	granted  int64         // when this node applied the grant (or restored it): the dashboard's age, the hold-time histogram
	claimBy  int64         // a handed-over grant not claimed yet: its claim deadline; 0 otherwise
	// checkAt is when the leader next looks at the grant for suspicion:
	// its last renewal + suspectAfter while not suspect, its next
	// checkpoint while suspect; 0 for a lock-delay.
	checkAt int64
	// loggedLeft > 0: the FSM holds a suspect entry for version, with
	// the time left it logged (see logged).
	loggedLeft time.Duration
	idx        int32 // index in the heap, -1 when not in it
	expiring   bool  // an entry that ends it has been proposed
	delay      bool  // a lock-delay countdown
	// suspect: the leader no longer acknowledges renewals of the grant
	// from memory; they go through the log (see the package doc, Suspect
	// leases). Cleared only by an applied logged renewal (evTTL), or by a
	// new term of leadership whose table holds no suspect entry for it.
	suspect bool
	attrs   leaseAttrs
}

// leaseAttrs are the attributes of a countdown fixed when it is made.
type leaseAttrs uint8

const (
	// leaseRestored: the countdown came from a snapshot (reset) or from
	// an entry replayed after a restart, so granted is then, not the
	// grant: the grant is older than it says.
	leaseRestored leaseAttrs = 1 << iota
	// leaseShared: the countdown of a Shared grant, or of the lock-delay
	// of a lost one (owner set), kept in leaseClock.shared by (key, owner).
	leaseShared
)

// attrsOf returns the attributes of a countdown.
func attrsOf(restored, shared bool) leaseAttrs {
	var a leaseAttrs
	if restored {
		a |= leaseRestored
	}
	if shared {
		a |= leaseShared
	}
	return a
}

func (l *lease) restored() bool { return l.attrs&leaseRestored != 0 }
func (l *lease) shared() bool   { return l.attrs&leaseShared != 0 }

// logged reports whether the FSM holds a suspect entry for the
// countdown's version (whose time left is loggedLeft, always > 0: the FSM
// logs no suspect mark without time left).
func (l *lease) logged() bool { return l.loggedLeft > 0 }

// suspectAfter is how long, in nanoseconds, a grant of TTL ttl may go
// unrenewed before the leader marks it suspect: 2/5 of the TTL, past the
// client's renewal interval (TTL/3).
func suspectAfter(ttl time.Duration) int64 { return int64(ttl) * 2 / 5 }

// checkpointEvery is how often, in nanoseconds, the leader logs the time
// left of a grant that stays suspect: TTL/8, at least 50 ms apart.
func checkpointEvery(ttl time.Duration) int64 { return int64(max(ttl/8, 50*time.Millisecond)) }

// due is when the countdown next needs the leader: its deadline, its
// claim deadline or its suspicion check, whichever comes first.
func (l *lease) due() int64 {
	d := l.deadline
	if l.claimBy != 0 && l.claimBy < d {
		d = l.claimBy
	}
	if l.checkAt != 0 && l.checkAt < d {
		d = l.checkAt
	}
	return d
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

// leaseClock keeps a countdown per held key and per key in a lock-delay
// (and per Shared grant and per lost one in its lock-delay, by key and
// owner: leaseClock.shared),
// fed by the FSM's events on every node; only the leader's is used to
// expire, to release unclaimed handovers, to end lock-delays, to mark
// grants suspect and to renew. A restored table, and every new term of
// leadership, restart each countdown at its full TTL (a suspect grant at
// the time left its suspect entry logged, each lock-delay at its full
// delay) and forget pending claims.
//
// It also keeps the leader's waiter grace: the queue entries of clients not
// connected to this node when it became the leader, each with the end of
// its grace.
type leaseClock struct {
	now         func() time.Time
	epoch       time.Time     // monotonic origin of deadlines
	claimWindow time.Duration // a handed-over grant must be claimed within this; 0: no claims
	// ended, when set (before the FSM runs), hears how long each grant
	// ended by an event was held, from its grant as this node applied it;
	// called with mu held, so it must not block (lockmetrics.go).
	ended func(held time.Duration)
	// replayTo is the last log index when the server started (set before
	// Raft runs): a grant made by an entry up to it is replayed, its age
	// unknown (lease.restored).
	replayTo uint64

	mu    sync.Mutex
	byKey *leaseIndex // the countdowns of Exclusive grants and lock-delays (table.go)
	// shared holds the countdowns of Shared grants (and of their
	// lock-delays) by key and owner: a key has many (shared.go).
	shared map[keyOwner]*lease
	heap   leaseHeap
	wake   chan struct{} // buffered 1: the earliest deadline may have moved
	// sleepDue is the earliest due the expiry loop saw when it last took
	// the expired countdowns (takeExpired), so it wakes by then at the
	// latest (math.MaxInt64: none); valid while sleepSet. apply wakes the
	// loop only for a countdown due before it: an event per applied entry
	// otherwise woke the loop to find nothing to do (a goroutine switch per
	// handoff on the critical path of a busy node).
	sleepDue int64
	sleepSet bool

	graceTerm uint64       // the term of leadership the grace entries belong to
	grace     []graceEntry // sorted by end of grace
}

// graceEntry is one queue entry whose client was not connected to this node
// when it became the leader: it keeps its place until at, unless its owner
// re-attaches (which moves the entry's since in the FSM).
type graceEntry struct {
	ko    keyOwner
	since uint64 // the entry's since as the new leader read it
	at    int64  // end of its grace (deadline units)
}

func newLeaseClock(now func() time.Time, claimWindow time.Duration) *leaseClock {
	return &leaseClock{now: now, epoch: now(), claimWindow: claimWindow, byKey: newLeaseIndex(), shared: make(map[keyOwner]*lease), wake: make(chan struct{}, 1)}
}

// grantLease returns the countdown of owner's grant on key (its Shared
// grant when shared), not a lock-delay's, with c.mu held; nil when none.
func (c *leaseClock) grantLease(key, owner string, shared bool) *lease {
	var l *lease
	if shared {
		l = c.shared[keyOwner{key, owner}]
	} else {
		l = c.byKey.get(key)
	}
	if l == nil || l.delay || l.owner != owner {
		return nil
	}
	return l
}

// lookup returns the countdown of owner's grant on key, Exclusive or
// Shared (an owner token holds at most one), with c.mu held; nil when none.
func (c *leaseClock) lookup(key, owner string) *lease {
	if l := c.grantLease(key, owner, false); l != nil {
		return l
	}
	return c.grantLease(key, owner, true)
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

// put replaces key's countdown (for a Shared one, key's and owner's)
// with l, with c.mu held.
func (c *leaseClock) put(l *lease) {
	if l.shared() {
		ko := keyOwner{l.key, l.owner}
		if old := c.shared[ko]; old != nil && old.idx >= 0 {
			heap.Remove(&c.heap, int(old.idx))
		}
		c.shared[ko] = l
		heap.Push(&c.heap, l)
		return
	}
	if old := c.byKey.get(l.key); old != nil && old.idx >= 0 {
		heap.Remove(&c.heap, int(old.idx))
	}
	c.byKey.put(l)
	heap.Push(&c.heap, l)
}

// drop removes l, with c.mu held.
func (c *leaseClock) drop(l *lease) {
	if l.idx >= 0 {
		heap.Remove(&c.heap, int(l.idx))
	}
	if l.shared() {
		delete(c.shared, keyOwner{l.key, l.owner})
		return
	}
	c.byKey.del(l.key)
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
	earliest := int64(math.MaxInt64) // the earliest due of a countdown made or moved
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evGranted:
			l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, restart: max(ev.restartTTL, ev.ttl), version: ev.version, deadline: now + int64(ev.ttl), checkAt: now + suspectAfter(ev.ttl), granted: now, attrs: attrsOf(ev.version <= c.replayTo, ev.shared)}
			if ev.handoff && c.claimWindow > 0 {
				l.claimBy = now + int64(c.claimWindow)
			}
			c.put(l)
			earliest = min(earliest, l.due())
		case evRemoved:
			if l := c.grantLease(ev.key, ev.owner, ev.shared); l != nil {
				if c.ended != nil && !l.restored() {
					c.ended(time.Duration(now - l.granted))
				}
				c.drop(l)
			}
		case evTTL:
			// A TTL change or a retried acquire by the holder, through the
			// log: the countdown restarts with the entry's version, which
			// makes any expiry proposed for an older version stale. The
			// holder asked, so a pending claim is made too, and a suspect
			// mark is cleared (the only way to clear it: see Suspect
			// leases in the package doc). A deadline never moves earlier:
			// a shorter TTL must not bring forward an end already
			// acknowledged.
			if l := c.grantLease(ev.key, ev.owner, ev.shared); l != nil {
				l.ttl = ev.ttl
				l.restart = max(ev.restartTTL, ev.ttl)
				l.version = ev.version
				l.deadline = max(l.deadline, now+int64(ev.ttl))
				l.checkAt = now + suspectAfter(ev.ttl)
				l.claimBy = 0
				l.expiring = false
				l.suspect, l.loggedLeft = false, 0
				c.fix(l)
				earliest = min(earliest, l.due())
			}
		case evSuspect:
			// The table now holds the grant's time left: a new leader
			// restarts the countdown with it. The leader that logged it
			// marked the grant suspect already.
			if l := c.grantLease(ev.key, ev.owner, ev.shared); l != nil && l.version == ev.version && ev.ttl > 0 {
				l.loggedLeft = ev.ttl
			}
		case evDelayed:
			l := &lease{key: ev.key, owner: ev.owner, ttl: ev.ttl, version: ev.version, deadline: now + int64(ev.ttl), delay: true, attrs: attrsOf(false, ev.shared)}
			c.put(l)
			earliest = min(earliest, l.due())
		case evDelayEnded:
			l := c.byKey.get(ev.key)
			if ev.shared {
				l = c.shared[keyOwner{ev.key, ev.owner}]
			}
			if l != nil && l.delay && l.version == ev.version {
				c.drop(l)
			}
		}
	}
	// A countdown removed, or moved later, needs no wake: the loop wakes
	// at the due it saw, finds nothing and sleeps again.
	wake := !c.sleepSet || earliest < c.sleepDue
	c.mu.Unlock()
	if wake {
		c.poke()
	}
}

// restartAt restarts l from now, as a new term of leadership does: a
// grant with a suspect entry at the time left the entry holds, and it stays
// suspect; any other grant at its longest TTL; a lock-delay at its delay.
// It forgets a proposed end and a pending claim. With c.mu held (or l
// not yet shared).
func (l *lease) restartAt(now int64) {
	switch {
	case l.delay:
		l.deadline = now + int64(l.ttl)
		l.checkAt = 0
	case l.logged():
		l.deadline = now + int64(l.loggedLeft)
		l.suspect = true
		l.checkAt = now + checkpointEvery(l.ttl)
	default:
		l.deadline = now + int64(max(l.restart, l.ttl))
		l.suspect = false
		l.checkAt = now + suspectAfter(l.ttl)
	}
	l.claimBy = 0
	l.expiring = false
}

// reset replaces every countdown with state's (evGranted and evDelayed
// events), each restarted from now as restartAll does.
func (c *leaseClock) reset(state []event) {
	now := c.at(c.now())
	c.mu.Lock()
	c.byKey = newLeaseIndex()
	c.shared = make(map[keyOwner]*lease)
	c.heap = make(leaseHeap, 0, len(state))
	for _, ev := range state {
		l := &lease{key: ev.key, owner: ev.owner, fence: ev.fence, ttl: ev.ttl, restart: max(ev.restartTTL, ev.ttl), version: ev.version, idx: int32(len(c.heap)), delay: ev.kind == evDelayed, granted: now, attrs: attrsOf(true, ev.shared)}
		if ev.suspect && ev.left > 0 {
			l.loggedLeft = ev.left
		}
		l.restartAt(now)
		if ev.shared {
			c.shared[keyOwner{ev.key, ev.owner}] = l
		} else {
			c.byKey.put(l)
		}
		c.heap = append(c.heap, l)
	}
	heap.Init(&c.heap)
	c.sleepSet = false
	c.mu.Unlock()
	c.poke()
}

// restartAll restarts every countdown from now (a new term of leadership):
// a grant at its longest TTL, or, when the table holds a suspect entry for
// it, at the time left that entry logged (measured from now, this node's
// election, later than when the entry was proposed), and the grant stays
// suspect. It forgets proposed ends and pending claims: a new leader cannot
// know whether a claim reached its predecessor, so it treats every grant as
// claimed (late, never early). It also drops the grace of the previous term.
func (c *leaseClock) restartAll() {
	now := c.at(c.now())
	c.mu.Lock()
	c.heap = c.heap[:0]
	for l := range c.byKey.all() {
		l.restartAt(now)
		l.idx = int32(len(c.heap))
		c.heap = append(c.heap, l)
	}
	for _, l := range c.shared {
		l.restartAt(now)
		l.idx = int32(len(c.heap))
		c.heap = append(c.heap, l)
	}
	heap.Init(&c.heap)
	c.graceTerm, c.grace = 0, nil
	c.sleepSet = false
	c.mu.Unlock()
	c.poke()
}

// renewOutcome is the clock's answer to one renewal.
type renewOutcome int

const (
	renewOK       renewOutcome = iota
	renewLost                  // not the holder, its countdown or claim window ran out, or an end was proposed
	renewNeedsLog              // a different TTL, or a suspect grant: must go through the log
)

// renew moves the deadline of owner's grant on key to now + its TTL, and
// claims a handed-over grant, when owner holds key, neither its countdown
// nor its claim window has run out, and the grant is not suspect. ttl 0
// keeps the TTL. A suspect grant, or a new TTL, needs the log
// (renewNeedsLog): the caller proposes opSetTTL.
func (c *leaseClock) renew(key, owner string, ttl time.Duration, t time.Time) renewOutcome {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookup(key, owner)
	if l == nil || l.expiring || now >= l.deadline || (l.claimBy != 0 && now >= l.claimBy) {
		return renewLost
	}
	if l.suspect || (ttl != 0 && ttl != l.ttl) {
		return renewNeedsLog
	}
	l.deadline = max(l.deadline, now+int64(l.ttl)) // never earlier than an end already acknowledged
	l.checkAt = max(l.checkAt, now+suspectAfter(l.ttl))
	l.claimBy = 0
	c.fix(l)
	return renewOK
}

// remaining returns the time left on the countdown of key's Exclusive
// grant with fence, if this node has it.
func (c *leaseClock) remaining(key string, fence uint64) (time.Duration, bool) {
	c.mu.Lock()
	l := c.byKey.get(key)
	c.mu.Unlock()
	if l == nil || l.delay {
		return 0, false
	}
	return c.remainingOf(key, l.owner, fence)
}

// remainingOf returns the time left on the countdown of owner's grant
// (Exclusive or Shared) on key with fence, if this node has it.
func (c *leaseClock) remainingOf(key, owner string, fence uint64) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookup(key, owner)
	if l == nil || l.fence != fence {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// held returns, for key's grant with fence, how long ago this node applied
// it (restored: it came from a snapshot or a replayed entry, and age is
// since then) and
// the time left on its countdown, if this node has it. Only the leader's
// time left counts: renewals move the leader's countdown alone.
func (c *leaseClock) held(key, owner string, fence uint64) (age, left time.Duration, restored, ok bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookup(key, owner)
	if l == nil || l.fence != fence {
		return 0, 0, false, false
	}
	return time.Duration(max(now-l.granted, 0)), time.Duration(max(l.deadline-now, 0)), l.restored(), true
}

// delayRemaining returns the time left on key's lock-delay, if one runs.
func (c *leaseClock) delayRemaining(key string) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byKey.get(key)
	if l == nil || !l.delay {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// sharedDelayRemaining returns the time left on the lock-delay of owner's
// lost Shared grant on key, if one runs.
func (c *leaseClock) sharedDelayRemaining(key, owner string) (time.Duration, bool) {
	now := c.at(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.shared[keyOwner{key, owner}]
	if l == nil || !l.delay {
		return 0, false
	}
	return time.Duration(max(l.deadline-now, 0)), true
}

// isSuspect reports whether owner's grant on key is marked suspect.
func (c *leaseClock) isSuspect(key, owner string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookup(key, owner)
	return l != nil && l.suspect
}

// fireKind is what the leader must propose for a countdown that ran out.
type fireKind int

const (
	fireExpire    fireKind = iota // the grant's countdown ran out: opExpire
	fireUnclaimed                 // the handed-over grant was not claimed in time: opUnclaimed
	fireEndDelay                  // the key's lock-delay ran out: opEndDelay
	fireSuspect                   // the grant went unrenewed (or stays suspect): opSuspect with left
)

// fired is one countdown that ran out, or a grant to log as suspect.
type fired struct {
	kind fireKind
	x    expiry        // key, owner ("" for a delay) and version
	left time.Duration // fireSuspect: the time left on the countdown when marked
}

// takeExpired returns up to limit countdowns that need the leader, and the
// time of the next one (zero when none). A countdown that ran out (its
// deadline, claim deadline or lock-delay) is marked expiring and leaves the
// heap. A grant unrenewed for suspectAfter, or suspect and due for a
// checkpoint, is marked suspect from this moment (no renewal of it is
// acknowledged from memory any more), returned as fireSuspect with its time
// left, and stays in the heap with its next checkpoint.
func (c *leaseClock) takeExpired(t time.Time, limit int) ([]fired, time.Time) {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []fired
	c.sleepSet, c.sleepDue = true, math.MaxInt64
	for len(c.heap) > 0 && len(out) < limit {
		l := c.heap[0]
		if now < l.due() {
			c.sleepDue = l.due()
			return out, c.toTime(l.due())
		}
		x := expiry{key: l.key, owner: l.owner, version: l.version}
		if !l.delay && now < l.deadline && (l.claimBy == 0 || now < l.claimBy) {
			// The suspicion check came first.
			l.suspect = true
			l.checkAt = now + checkpointEvery(l.ttl)
			heap.Fix(&c.heap, 0)
			out = append(out, fired{kind: fireSuspect, x: x, left: time.Duration(l.deadline - now)})
			continue
		}
		heap.Pop(&c.heap)
		l.expiring = true
		f := fired{kind: fireExpire, x: x}
		switch {
		case l.delay:
			f.kind = fireEndDelay
		case now < l.deadline: // the claim deadline came first
			f.kind = fireUnclaimed
		}
		out = append(out, f)
	}
	if len(c.heap) > 0 {
		c.sleepDue = c.heap[0].due()
		return out, c.toTime(c.heap[0].due())
	}
	return out, time.Time{}
}

// retry puts back countdowns whose entry failed, to be tried again after
// delay. A suspect entry that failed needs nothing: the grant stays suspect
// and its next checkpoint logs it again.
func (c *leaseClock) retry(fs []fired, delay time.Duration) {
	at := c.at(c.now().Add(delay))
	c.mu.Lock()
	for _, f := range fs {
		if f.kind == fireSuspect {
			continue
		}
		l := c.byKey.get(f.x.key)
		if l == nil || l.owner != f.x.owner {
			l = c.shared[keyOwner{f.x.key, f.x.owner}]
		}
		if l != nil && l.owner == f.x.owner && l.version == f.x.version && l.expiring {
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
	return c.byKey.len() + len(c.shared)
}

// setGrace replaces the waiter grace with entries, for the given term of
// leadership: each queue entry keeps its place until now + its ttl.
func (c *leaseClock) setGrace(term uint64, entries []queuedEntry) {
	now := c.at(c.now())
	g := make([]graceEntry, 0, len(entries))
	for _, e := range entries {
		g = append(g, graceEntry{ko: e.ko, since: e.since, at: now + int64(e.ttl)})
	}
	sort.Slice(g, func(i, j int) bool { return g[i].at < g[j].at })
	c.mu.Lock()
	c.graceTerm, c.grace = term, g
	c.mu.Unlock()
	c.poke()
}

// takeGrace returns up to limit queue entries whose grace ended at t, with
// the term they belong to, and the end of the next grace (zero when none).
func (c *leaseClock) takeGrace(t time.Time, limit int) (uint64, []graceEntry, time.Time) {
	now := c.at(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(c.grace) && n < limit && c.grace[n].at <= now {
		n++
	}
	out := c.grace[:n:n]
	c.grace = c.grace[n:]
	var next time.Time
	if len(c.grace) > 0 {
		next = c.toTime(c.grace[0].at)
	}
	return c.graceTerm, out, next
}

// regrace puts back grace entries whose purge failed, to be tried again
// after delay, if the term has not changed.
func (c *leaseClock) regrace(term uint64, gs []graceEntry, delay time.Duration) {
	at := c.at(c.now().Add(delay))
	c.mu.Lock()
	if c.graceTerm == term {
		for _, g := range gs {
			g.at = at
			c.grace = append(c.grace, g)
		}
		sort.SliceStable(c.grace, func(i, j int) bool { return c.grace[i].at < c.grace[j].at })
	}
	c.mu.Unlock()
	c.poke()
}
