package server

// shared.go owns the Shared grants of the lock table (counted permits and
// the read side of read-write locks): acquiring, handing over, ending,
// force releasing and checking them, their lock-delay, and their snapshot
// encoding. It is part of the FSM: everything here runs under fsm.mu, from
// Apply or Restore, and reads no clock.
//
// A key holds either one Exclusive grant (a plain lock: lockEntry.held), or
// up to lockEntry.limit Shared grants (any number when the limit is 0), or
// runs a lock-delay, never two of these at once. Its FIFO queue mixes both
// kinds; the head is granted as soon as the grants it holds allow, and one
// entry may grant several Shared heads (grantNext). A waiting Exclusive
// request therefore holds back every later Shared one: writer preference.
//
// Every grant, Shared ones included, has its own owner token, TTL,
// countdown (grant version), claim window, suspect mark and fence, and is
// renewed, released, expired and cancelled by (key, owner) exactly as a
// plain lock. Fences come from nextFence: max(index, lastFence+1), so the
// several grants one entry makes get distinct fences, strictly increasing
// per key (and server-wide), and a plain lock of a server that never made a
// Shared grant keeps the index of its entry as its fence.

import (
	"fmt"
	"slices"
	"time"
)

// MaxPermits is the largest permit limit of a Shared grant (the client's
// driver.MaxPermits).
const MaxPermits = 10000

// liveShared returns owner's Shared grant on e, unless it was lost and
// runs its lock-delay (or e is nil).
func liveShared(e *lockEntry, owner string) *grant {
	if e == nil {
		return nil
	}
	if g := e.shared[owner]; g != nil && !g.delayed {
		return g
	}
	return nil
}

// leases returns the server's lease count, the limit MaxLeases bounds: one
// per key with an Exclusive grant or a lock-delay, one per Shared grant.
func (f *fsm) leases() uint64 {
	return uint64(f.locks.len() - f.sharedKeys + f.nshared)
}

// nextFence returns the fence of a grant made by the entry at index idx:
// idx, or lastFence+1 when an earlier grant (of this entry or of a
// previous one that granted several) took idx already.
func (f *fsm) nextFence(idx uint64) uint64 {
	fence := max(idx, f.lastFence+1)
	f.lastFence = fence
	return fence
}

func (f *fsm) addShared(e *lockEntry, g *grant) {
	x := e.own()
	if x.shared == nil {
		x.shared = make(map[string]*grant)
	}
	if len(x.shared) == 0 {
		f.sharedKeys++
	}
	x.shared[g.owner] = g
	f.nshared++
}

func (f *fsm) dropShared(e *lockEntry, owner string) {
	if _, ok := e.shared[owner]; !ok {
		return
	}
	delete(e.shared, owner)
	f.nshared--
	if len(e.shared) == 0 {
		e.shared = nil
		f.sharedKeys--
		if e.nsw == 0 {
			e.limit = 0
		}
		e.trim()
	}
}

// grantShared gives w a Shared grant of e with version idx and the next
// fence, and returns the fence.
func (f *fsm) grantShared(idx uint64, key string, e *lockEntry, w waiter, handoff bool, evs []event) (uint64, []event) {
	fence := f.nextFence(idx)
	g := &grant{owner: w.owner, p: w.p, fence: fence, ttl: w.ttl, restartTTL: w.ttl, lockDelay: w.lockDelay, version: idx}
	f.addShared(e, g)
	return fence, append(evs, event{kind: evGranted, key: key, owner: w.owner, session: w.session(), holder: w.holder(), fence: fence, ttl: w.ttl, restartTTL: w.ttl, version: idx, handoff: handoff, shared: true})
}

// acquireShared is acquire for a Shared grant (c.shared, of c.limit
// permits). A key whose Shared grants or waiters have another limit refuses
// it (resBadLimit). The request is granted when the key holds no Exclusive
// grant, runs no lock-delay, nobody waits before it (FIFO) and a permit is
// free; otherwise it is queued (c.wait) or refused.
func (f *fsm) acquireShared(idx uint64, c *command, e *lockEntry, evs []event) (applyResult, []event) {
	limit := int(c.limit)
	newWaiter := func() waiter {
		return waiter{owner: c.owner, p: f.strs.get(c.holder, c.session), ttl: c.ttl, lockDelay: c.lockDelay, since: idx, shared: true}
	}
	if e == nil {
		if f.leases() >= c.maxLeases {
			return applyResult{code: resTooManyLeases}, evs
		}
		e = newLockEntry()
		e.own().limit = limit
		f.locks.put(c.key, e)
		w := newWaiter()
		w.since = 0
		var fence uint64
		fence, evs = f.grantShared(idx, c.key, e, w, false, evs)
		return applyResult{code: resGranted, fence: fence, ttl: c.ttl}, evs
	}
	if g := e.shared[c.owner]; g != nil {
		if g.delayed { // the owner's grant was lost: a token is never granted twice
			return applyResult{code: resDelayed}, evs
		}
		// A retried request of the holder: renewed through the log, and
		// bound to the retry's session, as a plain lock's retry is.
		f.rebindSession(g, c.session)
		evs = restartGrant(idx, c.key, g, true, c.ttl, evs)
		return applyResult{code: resGranted, fence: g.fence, ttl: c.ttl}, evs
	}
	if e.held && e.grant.owner == c.owner {
		return applyResult{code: resHeld}, evs
	}
	sharedSide := len(e.shared) > 0 || e.nsw > 0
	if sharedSide && e.limit != limit {
		return applyResult{code: resBadLimit, limit: e.limit}, evs
	}
	if n := e.q.find(c.owner); n != nil {
		if !c.wait || !n.shared {
			return applyResult{code: resHeld}, evs
		}
		n.since = idx // re-attached
		return applyResult{code: resQueued, position: e.q.position(n)}, evs
	}
	if !e.held && e.delayVersion == 0 && e.q.len() == 0 && (limit == 0 || len(e.shared) < limit) {
		if f.leases() >= c.maxLeases {
			return applyResult{code: resTooManyLeases}, evs
		}
		e.own().limit = limit
		w := newWaiter()
		w.since = 0
		var fence uint64
		fence, evs = f.grantShared(idx, c.key, e, w, false, evs)
		return applyResult{code: resGranted, fence: fence, ttl: c.ttl}, evs
	}
	if !c.wait {
		if !e.held && len(e.shared) == 0 && e.delayVersion != 0 {
			return applyResult{code: resDelayed}, evs
		}
		return applyResult{code: resHeld}, evs
	}
	if uint64(e.q.len()) >= c.maxWaiters {
		return applyResult{code: resTooManyWaiters}, evs
	}
	if c.maxTotalWaiters > 0 && uint64(f.waiting) >= c.maxTotalWaiters {
		return applyResult{code: resTooManyQueued}, evs
	}
	x := e.own()
	x.limit = limit
	x.q.push(newWaiter())
	x.nsw++
	f.waiting++
	evs = append(evs, event{kind: evQueued, key: c.key, owner: c.owner, version: idx})
	return applyResult{code: resQueued, position: e.q.len()}, evs
}

// endShared ends the Shared grant g of e. After an expiry with a lock-delay
// the grant stays as a lost one (g.delayed) whose permit is taken until
// opEndSharedDelay; otherwise it is removed and the waiters it held back
// are granted (grantNext). It returns the first new fence, or 0.
func (f *fsm) endShared(idx uint64, key string, e *lockEntry, g *grant, why removeReason, evs []event) (uint64, []event) {
	evs = append(evs, event{kind: evRemoved, key: key, owner: g.owner, session: g.session(), holder: g.holder(), fence: g.fence, ttl: g.ttl, version: g.version, reason: why, shared: true})
	f.strs.put(g.p)
	if g.lockDelay > 0 && why == reasonExpired {
		*g = grant{owner: g.owner, fence: g.fence, lockDelay: g.lockDelay, version: idx, delayed: true}
		return 0, append(evs, event{kind: evDelayed, key: key, owner: g.owner, ttl: g.lockDelay, version: idx, shared: true})
	}
	f.dropShared(e, g.owner)
	return f.grantNext(idx, key, e, evs)
}

// endSharedDelay frees the permit of a lost Shared grant whose lock-delay
// ran out (the version the leader's countdown ran for), and grants the
// waiters it held back.
func (f *fsm) endSharedDelay(idx uint64, c *command, evs []event) (applyResult, []event) {
	e := f.locks.get(c.key)
	if e == nil {
		return applyResult{code: resOK}, evs
	}
	g := e.shared[c.owner]
	if g == nil || !g.delayed || g.version != c.version {
		return applyResult{code: resOK}, evs
	}
	evs = append(evs, event{kind: evDelayEnded, key: c.key, owner: c.owner, version: c.version, shared: true})
	f.dropShared(e, c.owner)
	var next uint64
	next, evs = f.grantNext(idx, c.key, e, evs)
	return applyResult{code: resOK, fence: next}, evs
}

// forceReleaseShared removes every Shared grant of e (an operator's
// override), lost ones in their lock-delay included. The key then runs the
// longest lock-delay of the live grants removed, as a key whose Exclusive
// grant was force-released does, or is handed to its waiters. A key with
// only lost grants is not held: resLost, nothing changes.
func (f *fsm) forceReleaseShared(idx uint64, key string, e *lockEntry, evs []event) (applyResult, []event) {
	gs := sortedShared(e)
	n := 0
	for i := range gs {
		if !gs[i].delayed {
			n++
		}
	}
	if n == 0 {
		return applyResult{code: resLost}, evs
	}
	var removed grant
	var delay time.Duration
	for i := range gs {
		g := &gs[i]
		if g.delayed {
			evs = append(evs, event{kind: evDelayEnded, key: key, owner: g.owner, version: g.version, shared: true})
		} else {
			if removed.fence == 0 {
				removed = *g
			}
			evs = append(evs, event{kind: evRemoved, key: key, owner: g.owner, session: g.session(), holder: g.holder(), fence: g.fence, ttl: g.ttl, version: g.version, reason: reasonForced, shared: true})
			f.strs.put(g.p)
			delay = max(delay, g.lockDelay)
		}
		f.dropShared(e, g.owner)
	}
	if delay > 0 {
		x := e.own()
		x.delay, x.delayVersion = delay, idx
		evs = append(evs, event{kind: evDelayed, key: key, ttl: delay, version: idx})
		return applyResult{code: resOK, removed: removed, nremoved: n}, evs
	}
	var next uint64
	next, evs = f.grantNext(idx, key, e, evs)
	return applyResult{code: resOK, fence: next, removed: removed, nremoved: n}, evs
}

// sortedShared returns copies of e's Shared grants, by fence.
func sortedShared(e *lockEntry) []grant {
	if len(e.shared) == 0 {
		return nil
	}
	out := make([]grant, 0, len(e.shared))
	for _, g := range e.shared {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b grant) int {
		switch {
		case a.fence < b.fence:
			return -1
		case a.fence > b.fence:
			return 1
		}
		return 0
	})
	return out
}

// sharedInto describes e's Shared grants in v: a key with a live Shared
// grant is held, and v.grant is its oldest (lowest fence) live grant; with
// all, v.grants lists every live one, by fence.
func sharedInto(e *lockEntry, v *holderView, all bool) {
	if len(e.shared) == 0 {
		return
	}
	v.shared, v.limit = true, e.limit
	var oldest *grant
	for _, g := range e.shared {
		if g.delayed {
			v.delayed++
			continue
		}
		v.holders++
		if oldest == nil || g.fence < oldest.fence {
			oldest = g
		}
	}
	if oldest != nil {
		v.held, v.grant = true, *oldest
	}
	if all {
		for _, g := range sortedShared(e) {
			if !g.delayed {
				v.grants = append(v.grants, g)
			} else {
				v.lostOwners = append(v.lostOwners, g.owner)
			}
		}
	}
}

// wouldRefuse reports whether a try (no wait) of key by owner would be
// refused by the table as it is: the Exclusive grant (shared false) of a
// key that exists and is not owner's; a Shared grant of limit of a key
// held exclusively, in a lock-delay, with waiters, or with every permit
// taken. A request the log must answer (a retry by the holder, a limit
// that differs from the key's) is not refused here.
func (f *fsm) wouldRefuse(key, owner string, shared bool, limit int) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks.get(key)
	if e == nil {
		return false
	}
	if !shared {
		return !e.held || e.grant.owner != owner
	}
	if g := e.shared[owner]; g != nil {
		return g.delayed
	}
	if e.held {
		return true
	}
	if (len(e.shared) > 0 || e.nsw > 0) && e.limit != limit {
		return false
	}
	if e.delayVersion != 0 || e.q.len() > 0 {
		return true
	}
	return limit > 0 && len(e.shared) >= limit
}

// checkShared verifies the Shared invariants of key's entry: never Shared
// grants with an Exclusive grant or a key-wide lock-delay; at most limit
// of them; each keyed by its owner, with a fence no later than lastFence;
// fences distinct within the key; the count of Shared waiters; and no
// waiter at the head that the grants held would allow (grantNext ran).
func (f *fsm) checkShared(k string, e *lockEntry) error {
	if len(e.shared) > 0 && (e.held || e.delayVersion != 0) {
		return fmt.Errorf("key %q: %d shared grants with an exclusive grant (%v) or a lock-delay (%d)", k, len(e.shared), e.held, e.delayVersion)
	}
	if e.limit < 0 || e.limit > MaxPermits || (e.limit > 0 && len(e.shared) > e.limit) {
		return fmt.Errorf("key %q: %d shared grants, limit %d", k, len(e.shared), e.limit)
	}
	fences := make(map[uint64]bool, len(e.shared)+1)
	if e.held {
		fences[e.grant.fence] = true
	}
	for o, g := range e.shared {
		switch {
		case g.owner != o:
			return fmt.Errorf("key %q: shared grant of %q filed under %q", k, g.owner, o)
		case g.fence == 0 || g.fence > f.lastFence || g.version == 0:
			return fmt.Errorf("key %q: shared grant of %q: fence %d version %d (last fence %d)", k, o, g.fence, g.version, f.lastFence)
		case fences[g.fence]:
			return fmt.Errorf("key %q: fence %d issued twice", k, g.fence)
		case g.suspect != (g.suspectLeft > 0):
			return fmt.Errorf("key %q: shared grant of %q suspect %v with %v left", k, o, g.suspect, g.suspectLeft)
		case g.delayed && g.lockDelay == 0:
			return fmt.Errorf("key %q: lost shared grant of %q in a lock-delay of 0", k, o)
		}
		fences[g.fence] = true
	}
	nsw := 0
	e.q.each(func(w *waiter) {
		if w.shared {
			nsw++
		}
	})
	if nsw != e.nsw {
		return fmt.Errorf("key %q: %d shared waiters counted, %d queued", k, e.nsw, nsw)
	}
	if h := e.q.head; h != nil && !e.held && e.delayVersion == 0 {
		blocked := h.shared && e.limit > 0 && len(e.shared) >= e.limit || !h.shared && len(e.shared) > 0
		if !blocked {
			return fmt.Errorf("key %q: head waiter %q (shared %v) could be granted (%d shared grants, limit %d)", k, h.owner, h.shared, len(e.shared), e.limit)
		}
	}
	return nil
}

// encodeSharedGrant writes one Shared grant of a snapshot (v4).
func encodeSharedGrant(e *enc, g *grant) {
	encodeGrantFields(e, g)
	e.boolean(g.delayed)
}

// encodeGrantFields writes the fields a snapshot keeps of every grant, an
// entry's exclusive grant (encodeSnapEntry) and each Shared grant alike:
// owner, holder, session, fence, TTL, lock-delay, version, restart TTL,
// suspect and the suspect's time left.
func encodeGrantFields(e *enc, g *grant) {
	e.str(g.owner)
	e.str(g.holder())
	e.str(g.session())
	e.u64(g.fence)
	e.dur(g.ttl)
	e.dur(g.lockDelay)
	e.u64(g.version)
	e.dur(g.restartTTL)
	e.boolean(g.suspect)
	e.dur(g.suspectLeft)
}

// decodeSharedEntry reads what a v4 snapshot adds to an entry: its limit
// and Shared grants.
func decodeSharedEntry(d *dec, e *lockEntry, strs interner) error {
	limit := d.u64()
	n := d.u64()
	if d.err != nil {
		return d.err
	}
	if limit > MaxPermits || n > uint64(len(d.b)) || (limit > 0 && n > limit) {
		return errCorrupt
	}
	if limit != 0 || n != 0 {
		e.own().limit = int(limit)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		g := &grant{owner: d.str(), p: strs.get(d.str(), d.str()), fence: d.u64(), ttl: d.dur(), lockDelay: d.dur(), version: d.u64(), restartTTL: d.dur(), suspect: d.boolean(), suspectLeft: d.dur(), delayed: d.boolean()}
		if d.err != nil {
			break
		}
		if g.fence == 0 || g.suspect != (g.suspectLeft > 0) || e.shared[g.owner] != nil || (e.held && e.grant.owner == g.owner) || (g.delayed && g.lockDelay == 0) {
			return errCorrupt
		}
		if e.shared == nil {
			e.shared = make(map[string]*grant, n)
		}
		e.shared[g.owner] = g
	}
	if d.err != nil {
		return d.err
	}
	if len(e.shared) > 0 && (e.held || e.delayVersion != 0) {
		return errCorrupt
	}
	return nil
}

// restoredShared returns, for a restored table, the last fence issued (the
// snapshot's, or for a snapshot older than v4, whose fences were indexes,
// the greatest fence it holds) and its Shared counts.
func restoredShared(locks lockTable, lastFence uint64) (last uint64, nshared, sharedKeys int) {
	last = lastFence
	for _, e := range locks.all() {
		if e.held {
			last = max(last, e.grant.fence)
		}
		for _, g := range e.shared {
			last = max(last, g.fence)
		}
		if len(e.shared) > 0 {
			sharedKeys++
			nshared += len(e.shared)
		}
	}
	return last, nshared, sharedKeys
}

// sharedLimit returns the permit limit of key's Shared grants and waiters;
// ok is false when it has none.
func (f *fsm) sharedLimit(key string) (limit int, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks.get(key)
	if e == nil || len(e.shared) == 0 && e.nsw == 0 {
		return 0, false
	}
	return e.limit, true
}

// rebindSession binds grant g to session, when session is set: a retried
// acquisition by the holder's owner token (Locker.Resume from another
// process) moves the push of the grant's loss to the session of the
// process that now holds it.
func (f *fsm) rebindSession(g *grant, session string) {
	if session == "" || session == g.session() {
		return
	}
	old := g.p
	g.p = f.strs.get(g.holder(), session)
	f.strs.put(old)
}

// anySharedWaiter reports whether some key has a Shared waiter, with f.mu
// held.
func (f *fsm) anySharedWaiter() bool {
	for _, e := range f.locks.all() {
		if e.nsw > 0 {
			return true
		}
	}
	return false
}
