package server

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"
)

func sacq(key, owner string, limit uint64, wait bool) command {
	return command{op: opAcquire, key: key, owner: owner, ttl: time.Second, wait: wait, maxWaiters: 10, maxLeases: 100, shared: true, limit: limit}
}

func (h *fsmHarness) check() {
	h.t.Helper()
	if err := h.f.check(); err != nil {
		h.t.Fatal(err)
	}
}

// grantedEvents returns the evGranted events recorded since mark.
func (h *fsmHarness) grantedSince(mark int) []event {
	var out []event
	for _, ev := range h.rec.evs[mark:] {
		if ev.kind == evGranted {
			out = append(out, ev)
		}
	}
	return out
}

// TestFSM_SharedPermits: a key of 2 permits grants two Shared grants,
// queues the third, refuses another limit naming the key's, queues an
// Exclusive request, and a Shared request behind it waits too (FIFO).
func TestFSM_SharedPermits(t *testing.T) {
	h := newFSMHarness(t)
	r1 := h.apply(sacq("s", "a", 2, false))
	r2 := h.apply(sacq("s", "b", 2, false))
	if r1.code != resGranted || r2.code != resGranted || r1.fence != h.idx-1 || r2.fence != h.idx {
		t.Fatalf("two permits: %+v %+v", r1, r2)
	}
	if r := h.apply(sacq("s", "c", 2, false)); r.code != resHeld {
		t.Fatalf("third permit, try: %+v", r)
	}
	if r := h.apply(sacq("s", "c", 3, true)); r.code != resBadLimit || r.limit != 2 {
		t.Fatalf("another limit: %+v, want resBadLimit naming 2", r)
	}
	if r := h.apply(sacq("s", "c", 2, true)); r.code != resQueued || r.position != 1 {
		t.Fatalf("third permit, wait: %+v", r)
	}
	if r := h.apply(acq("s", "w", true)); r.code != resQueued || r.position != 2 {
		t.Fatalf("exclusive behind: %+v", r)
	}
	if r := h.apply(sacq("s", "d", 2, true)); r.code != resQueued || r.position != 3 {
		t.Fatalf("shared behind the exclusive: %+v", r)
	}
	if r := h.apply(acq("s", "a", false)); r.code != resHeld {
		t.Fatalf("exclusive request of a shared holder: %+v", r)
	}
	if r := h.apply(sacq("s", "a", 2, false)); r.code != resGranted || r.fence != r1.fence {
		t.Fatalf("retry of a shared holder: %+v, want its grant (fence %d)", r, r1.fence)
	}
	h.check()
	mark := len(h.rec.evs)
	if r := h.apply(command{op: opRelease, key: "s", owner: "a"}); r.code != resOK || r.fence != h.idx {
		t.Fatalf("release: %+v", r)
	}
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "c" || !gs[0].handoff || !gs[0].shared {
		t.Fatalf("release of a permit granted %+v, want c only", gs)
	}
	// The Exclusive waiter is at the head now: a release of b grants it
	// only after c leaves; d waits behind it.
	h.apply(command{op: opRelease, key: "s", owner: "b"})
	if v, _ := h.f.get("s"); v.holders != 1 || v.held != true || v.grant.owner != "c" {
		t.Fatalf("after b left: %+v", v)
	}
	mark = len(h.rec.evs)
	h.apply(command{op: opRelease, key: "s", owner: "c"})
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "w" || gs[0].shared {
		t.Fatalf("after the permits: %+v, want the exclusive waiter", gs)
	}
	mark = len(h.rec.evs)
	h.apply(command{op: opRelease, key: "s", owner: "w"})
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "d" {
		t.Fatalf("after the writer: %+v", gs)
	}
	h.apply(command{op: opRelease, key: "s", owner: "d"})
	if _, ok := h.f.get("s"); ok {
		t.Fatal("key still in the table after every grant left")
	}
	if l, _ := h.f.counts(); l != 0 {
		t.Fatalf("%d leases counted in an empty table", l)
	}
	h.check()
}

// TestFSM_SharedHandoffInOneEntry: a writer's release grants every reader
// queued behind it in one entry, with distinct fences above the entry's
// index; the next grant's fence is above them all, whatever its index.
func TestFSM_SharedHandoffInOneEntry(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("rw", "w", false))
	for _, o := range []string{"r1", "r2", "r3"} {
		if r := h.apply(sacq("rw", o, 0, true)); r.code != resQueued {
			t.Fatalf("reader %s: %+v", o, r)
		}
	}
	w2 := acq("rw", "w2", true) // a second writer behind the readers
	w2.maxWaiters = 10
	h.apply(w2)
	mark := len(h.rec.evs)
	r := h.apply(command{op: opRelease, key: "rw", owner: "w"})
	idx := h.idx
	gs := h.grantedSince(mark)
	if len(gs) != 3 || r.fence != idx {
		t.Fatalf("release granted %+v (next fence %d), want 3 readers from fence %d", gs, r.fence, idx)
	}
	for i, g := range gs {
		if g.fence != idx+uint64(i) || g.version != idx || !g.shared {
			t.Fatalf("reader %d: %+v, want fence %d version %d", i, g, idx+uint64(i), idx)
		}
	}
	if r := h.apply(acq("other", "x", false)); r.fence != idx+3 || h.idx != idx+1 {
		t.Fatalf("next grant (entry %d): fence %d, want %d", h.idx, r.fence, idx+3)
	}
	// Fences stay ahead of indexes by the extra grants until entries that
	// grant nothing let the index catch up.
	h.apply(command{op: opNoop})
	h.apply(command{op: opNoop})
	if r := h.apply(acq("later", "y", false)); r.fence != h.idx {
		t.Fatalf("fence %d at index %d, want the index once caught up", r.fence, h.idx)
	}
	// Readers leave; the second writer gets the key with a greater fence.
	mark = len(h.rec.evs)
	for _, o := range []string{"r2", "r1", "r3"} {
		h.apply(command{op: opRelease, key: "rw", owner: o})
	}
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "w2" || gs[0].fence <= idx+2 {
		t.Fatalf("after the readers: %+v", gs)
	}
	h.check()
}

// TestFSM_SharedExpiryClaimSuspect: a Shared grant's countdown versions,
// TTL changes, suspect marks, claim windows and cancellations act on that
// grant alone, by owner.
func TestFSM_SharedExpiryClaimSuspect(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(sacq("e", "a", 0, false))
	va := h.idx
	h.apply(sacq("e", "b", 0, false))
	vb := h.idx
	if r := h.apply(command{op: opSetTTL, key: "e", owner: "a", ttl: 5 * time.Second}); r.code != resOK {
		t.Fatalf("set TTL: %+v", r)
	}
	h.apply(command{op: opExpire, expiries: []expiry{{"e", "a", va}}}) // stale: the TTL change made a new version
	h.apply(command{op: opSuspect, suspects: []suspectMark{{"e", "b", vb, 300 * time.Millisecond}}})
	v, _ := h.f.get("e")
	if v.holders != 2 {
		t.Fatalf("stale expiry removed a grant: %+v", v)
	}
	for _, g := range v.grants {
		if g.owner == "b" && (!g.suspect || g.suspectLeft != 300*time.Millisecond) {
			t.Fatalf("suspect mark of b not set: %+v", g)
		}
	}
	h.apply(command{op: opExpire, expiries: []expiry{{"e", "b", vb}}})
	if v, _ := h.f.get("e"); v.holders != 1 || v.grant.owner != "a" {
		t.Fatalf("after b expired: %+v", v)
	}
	if r := h.apply(command{op: opRelease, key: "e", owner: "b"}); r.code != resLost {
		t.Fatalf("release after expiry: %+v", r)
	}
	// A writer queues; a reader queues behind it; the writer cancels: the
	// reader is granted at once (the writer held it back).
	h.apply(acq("e", "w", true))
	h.apply(sacq("e", "c", 0, true))
	mark := len(h.rec.evs)
	if r := h.apply(command{op: opCancelWait, key: "e", owner: "w"}); !r.dequeued {
		t.Fatalf("cancel: %+v", r)
	}
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "c" || !gs[0].handoff {
		t.Fatalf("after the writer's cancel: %+v", gs)
	}
	// A handed-over grant not claimed is released (opUnclaimed) by owner.
	vc := h.idx
	h.apply(command{op: opUnclaimed, expiries: []expiry{{"e", "c", vc}}})
	if r := h.apply(command{op: opCancelWait, key: "e", owner: "a"}); !r.released {
		t.Fatalf("cancel of a raced shared grant: %+v", r)
	}
	if _, ok := h.f.get("e"); ok {
		t.Fatal("key left in the table")
	}
	h.check()
}

// TestFSM_SharedLockDelay: a Shared grant lost by expiry keeps its permit
// taken, and the key closed to an Exclusive grant, for its lock-delay; a
// stale end of it does nothing; its end grants the waiters.
func TestFSM_SharedLockDelay(t *testing.T) {
	h := newFSMHarness(t)
	c := sacq("d", "a", 1, false)
	c.lockDelay = 500 * time.Millisecond
	h.apply(c)
	va := h.idx
	mark := len(h.rec.evs)
	h.apply(command{op: opExpire, expiries: []expiry{{"d", "a", va}}})
	vd := h.idx
	var delayed bool
	for _, ev := range h.rec.evs[mark:] {
		delayed = delayed || ev.kind == evDelayed && ev.shared && ev.owner == "a" && ev.ttl == c.lockDelay && ev.version == vd
	}
	if !delayed {
		t.Fatalf("no shared lock-delay event: %+v", h.rec.evs[mark:])
	}
	if r := h.apply(sacq("d", "b", 1, false)); r.code != resHeld {
		t.Fatalf("permit during the lost grant's lock-delay: %+v", r)
	}
	if r := h.apply(acq("d", "w", true)); r.code != resQueued {
		t.Fatalf("writer during the lock-delay: %+v", r)
	}
	if r := h.apply(command{op: opRelease, key: "d", owner: "a"}); r.code != resLost {
		t.Fatalf("release of the lost grant: %+v", r)
	}
	if r := h.apply(command{op: opForceRelease, key: "d"}); r.code != resLost {
		t.Fatalf("force release of a key with only a lost grant: %+v", r)
	}
	h.apply(command{op: opEndSharedDelay, key: "d", owner: "a", version: vd - 1}) // stale
	if v, _ := h.f.get("d"); v.delayed != 1 {
		t.Fatalf("stale end of the lock-delay acted: %+v", v)
	}
	mark = len(h.rec.evs)
	h.apply(command{op: opEndSharedDelay, key: "d", owner: "a", version: vd})
	if gs := h.grantedSince(mark); len(gs) != 1 || gs[0].owner != "w" {
		t.Fatalf("end of the lock-delay granted %+v", gs)
	}
	h.check()
}

// TestFSM_SharedForceRelease removes every Shared grant of a key, and the
// key runs the longest lock-delay of those removed.
func TestFSM_SharedForceRelease(t *testing.T) {
	h := newFSMHarness(t)
	for i, o := range []string{"a", "b", "c"} {
		c := sacq("f", o, 3, false)
		c.lockDelay = time.Duration(i) * 100 * time.Millisecond
		h.apply(c)
	}
	h.apply(sacq("f", "q", 3, true))
	h.apply(sacq("f", "q", 3, true)) // re-attach
	r := h.apply(command{op: opForceRelease, key: "f"})
	if r.code != resOK || r.nremoved != 3 || r.removed.owner != "a" || r.fence != 0 {
		t.Fatalf("force release: %+v", r)
	}
	v, ok := h.f.get("f")
	if !ok || v.held || v.shared || v.waiters != 1 {
		t.Fatalf("after the force release: %+v, want q waiting for the lock-delay", v)
	}
	h.f.mu.RLock()
	delay := h.f.locks.get("f").delay
	h.f.mu.RUnlock()
	if delay != 200*time.Millisecond {
		t.Fatalf("lock-delay %v, want the longest, 200ms", delay)
	}
	h.check()
}

// TestFSM_SharedSnapshotRestore: Shared grants (live and lost), Shared
// waiters, the key's limit and the last fence survive a snapshot, and a
// fence issued after the restore is above every fence issued before.
func TestFSM_SharedSnapshotRestore(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "w", false))
	for _, o := range []string{"r1", "r2", "r3"} {
		h.apply(sacq("k", o, 4, true))
	}
	w2 := acq("k", "w2", true)
	w2.maxWaiters = 10
	h.apply(w2)
	h.apply(sacq("k", "r4", 4, true))
	h.apply(command{op: opRelease, key: "k", owner: "w"}) // r1..r3 granted in one entry
	last := h.f.lastFence
	if last != h.idx+2 {
		t.Fatalf("last fence %d, want %d", last, h.idx+2)
	}
	c := sacq("p", "x", 1, false)
	c.lockDelay = time.Second
	h.apply(c)
	h.apply(command{op: opExpire, expiries: []expiry{{"p", "x", h.idx}}})
	h.check()
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	restored := newFSM(rec)
	restored.obs = nil
	if err := restored.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if a, b := dump(h.f), dump(restored); a != b {
		t.Fatalf("restore differs:\n%s\n%s", a, b)
	}
	if err := restored.check(); err != nil {
		t.Fatal(err)
	}
	st := stateLocked(restored.locks)
	var sharedGrants, sharedDelays int
	for _, ev := range st {
		switch {
		case ev.kind == evGranted && ev.shared:
			sharedGrants++
		case ev.kind == evDelayed && ev.shared:
			sharedDelays++
		}
	}
	if sharedGrants != 3 || sharedDelays != 1 {
		t.Fatalf("restored state: %d shared grants, %d shared delays: %+v", sharedGrants, sharedDelays, st)
	}
	// Entries after the snapshot: the fence is above the last one even at
	// an index below it.
	h2 := &fsmHarness{t: t, f: restored, rec: rec, idx: h.idx}
	restored.obs = rec
	if r := h2.apply(acq("new", "n", false)); r.fence <= last || r.fence <= h.f.lastFence {
		t.Fatalf("fence %d after the restore, last before %d", r.fence, h.f.lastFence)
	}
}

// TestFSM_SharedEncodingCompatible: plain commands are still written at
// version 2, byte for byte; Shared ones at version 3; a v3 snapshot (the
// format before Shared grants) still restores.
func TestFSM_SharedEncodingCompatible(t *testing.T) {
	plain := acq("k", "o", true)
	if b := plain.encode(); b[0] != 2 {
		t.Fatalf("plain acquire written at version %d", b[0])
	}
	c := sacq("k", "o", 7, true)
	b := c.encode()
	if b[0] != 3 {
		t.Fatalf("shared acquire written at version %d", b[0])
	}
	d, err := decodeCommand(b)
	if err != nil || !d.shared || d.limit != 7 || d.key != "k" || !d.wait {
		t.Fatalf("shared acquire decoded as %+v, %v", d, err)
	}
	bad := command{op: opAcquire, key: "k", owner: "o", limit: 3}
	bad.shared = true
	bb := bad.encode()
	bb[len(bb)-2] = 0 // shared false with a limit
	if _, err := decodeCommand(bb); err == nil {
		t.Fatal("a limit without shared decoded")
	}
	if _, err := decodeCommand(append([]byte{2, byte(opEndSharedDelay)}, 1, 'k', 1, 'o', 1)); err == nil {
		t.Fatal("opEndSharedDelay decoded at version 2")
	}

	// A table without Shared grants is written in v3 (readable by members
	// that predate them); one with Shared grants in v4.
	h0 := newFSMHarness(t)
	h0.apply(acq("p", "o", false))
	magic := func() string {
		snap, err := h0.f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			t.Fatal(err)
		}
		d := dec{b: sink.Bytes()}
		return d.str()
	}
	if m := magic(); m != snapshotMagicV3 {
		t.Fatalf("plain table written as %q, want %q", m, snapshotMagicV3)
	}
	h0.apply(sacq("s", "o", 0, false))
	if m := magic(); m != snapshotMagic {
		t.Fatalf("table with a Shared grant written as %q, want %q", m, snapshotMagic)
	}

	// A v3 snapshot: one held key with a waiter, one in a lock-delay.
	e := enc{}
	e.str(snapshotMagicV3)
	e.u64(40) // applied
	e.u64(2)
	for _, k := range []struct {
		key   string
		held  bool
		fence uint64
	}{{"held", true, 30}, {"delayed", false, 0}} {
		e.str(k.key)
		e.boolean(k.held)
		owner := ""
		if k.held {
			owner = "owner-1"
		}
		e.str(owner)
		e.str("")
		e.str("")
		e.u64(k.fence)
		e.dur(time.Second)
		e.dur(0)
		e.u64(k.fence)
		e.dur(time.Second)
		e.boolean(false)
		e.dur(0)
		if k.held {
			e.dur(0)
			e.u64(0)
			e.u64(1)
			e.str("waiter-1")
			e.str("")
			e.str("")
			e.dur(time.Second)
			e.dur(0)
			e.u64(35)
		} else {
			e.dur(time.Second)
			e.u64(38)
			e.u64(0)
		}
	}
	f := newFSM(nil)
	if err := f.Restore(io.NopCloser(bytes.NewReader(e.b))); err != nil {
		t.Fatalf("v3 snapshot: %v", err)
	}
	if err := f.check(); err != nil {
		t.Fatal(err)
	}
	if v, ok := f.get("held"); !ok || !v.held || v.grant.fence != 30 || v.waiters != 1 || f.lastFence != 30 {
		t.Fatalf("v3 snapshot restored as %+v (last fence %d)", v, f.lastFence)
	}
	h := &fsmHarness{t: t, f: f, rec: &recorder{}, idx: 40}
	f.obs = h.rec
	if r := h.apply(acq("x", "o", false)); r.fence != 41 {
		t.Fatalf("fence after a v3 restore: %d, want the index 41", r.fence)
	}
}

// TestFSM_SharedLimitsCountEachGrant: each Shared grant counts as one
// lease against MaxLeases.
func TestFSM_SharedLimitsCountEachGrant(t *testing.T) {
	h := newFSMHarness(t)
	for i := range 3 {
		c := sacq("l", fmt.Sprint("o", i), 0, false)
		c.maxLeases = 3
		if r := h.apply(c); r.code != resGranted {
			t.Fatalf("grant %d: %+v", i, r)
		}
	}
	c := sacq("l", "o3", 0, false)
	c.maxLeases = 3
	if r := h.apply(c); r.code != resTooManyLeases {
		t.Fatalf("fourth lease of 3: %+v", r)
	}
	p := acq("m", "p", false)
	p.maxLeases = 3
	if r := h.apply(p); r.code != resTooManyLeases {
		t.Fatalf("plain lock past the limit: %+v", r)
	}
	if l, _ := h.f.counts(); l != 3 {
		t.Fatalf("counted %d leases, want 3", l)
	}
	h.check()
}

// TestFSM_RetryRebindsSession: a retried acquisition by the holder's owner
// token with another session (a lease resumed by another process) binds
// the grant to it, Exclusive and Shared alike, so that its loss is pushed
// there; a retry without a session keeps the grant's.
func TestFSM_RetryRebindsSession(t *testing.T) {
	h := newFSMHarness(t)
	for _, shared := range []bool{false, true} {
		key := fmt.Sprint("rebind-", shared)
		c := acq(key, "o", false)
		c.shared, c.session = shared, "session-1"
		h.apply(c)
		c.session = "session-2"
		if r := h.apply(c); r.code != resGranted {
			t.Fatalf("retry: %+v", r)
		}
		c.session = ""
		h.apply(c)
		mark := len(h.rec.evs)
		h.apply(command{op: opExpire, expiries: []expiry{{key, "o", h.idx}}})
		var got string
		for _, ev := range h.rec.evs[mark:] {
			if ev.kind == evRemoved {
				got = ev.session
			}
		}
		if got != "session-2" {
			t.Fatalf("shared %v: loss told to session %q, want session-2", shared, got)
		}
		h.check()
	}
	if len(h.f.strs.m) != 0 {
		t.Fatalf("interned strings left: %v", h.f.strs.m)
	}
}

// TestLeaseClock_SharedCountdowns: the Shared grants of one key have a
// countdown each, renewed, claimed, expired, suspected and restarted by
// owner; a lost one's lock-delay fires as the end of that grant's delay.
func TestLeaseClock_SharedCountdowns(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, 500*time.Millisecond)
	c.apply([]event{
		{kind: evGranted, key: "k", owner: "a", fence: 5, version: 5, ttl: time.Second, shared: true},
		{kind: evGranted, key: "k", owner: "b", fence: 6, version: 5, ttl: 2 * time.Second, shared: true, handoff: true},
		{kind: evGranted, key: "p", owner: "x", fence: 7, version: 6, ttl: time.Second},
	})
	if c.size() != 3 {
		t.Fatalf("%d countdowns, want 3", c.size())
	}
	if got := c.renew("k", "c", 0, now); got != renewLost {
		t.Fatalf("renew by a stranger = %v", got)
	}
	if left, ok := c.remainingOf("k", "b", 6); !ok || left != 2*time.Second {
		t.Fatalf("b's countdown: %v %v", left, ok)
	}
	if _, ok := c.remaining("k", 5); ok {
		t.Fatal("remaining (the Exclusive grant's) found a Shared grant")
	}
	now = now.Add(400 * time.Millisecond)
	if got := c.renew("k", "a", 0, now); got != renewOK {
		t.Fatalf("renew of a = %v", got)
	}
	// b was handed over and not claimed: it fires as unclaimed; a, renewed,
	// does not expire with it.
	fs, _ := c.takeExpired(now.Add(100*time.Millisecond), 10)
	var unclaimed []expiry
	for _, f := range fs {
		if f.kind == fireUnclaimed {
			unclaimed = append(unclaimed, f.x)
		}
	}
	if len(unclaimed) != 1 || unclaimed[0] != (expiry{"k", "b", 5}) {
		t.Fatalf("fired %+v, want b unclaimed", fs)
	}
	c.apply([]event{{kind: evRemoved, key: "k", owner: "b", shared: true}})
	if _, ok := c.remainingOf("k", "a", 5); !ok {
		t.Fatal("a's countdown went with b's")
	}
	// a expires; its lock-delay runs by owner, then fires as its end.
	now = now.Add(2 * time.Second)
	fs, _ = c.takeExpired(now, 10)
	var expired bool
	for _, f := range fs {
		expired = expired || f.kind == fireExpire && f.x == (expiry{"k", "a", 5})
	}
	if !expired {
		t.Fatalf("fired %+v, want a expired", fs)
	}
	c.apply([]event{
		{kind: evRemoved, key: "k", owner: "a", shared: true},
		{kind: evDelayed, key: "k", owner: "a", ttl: 300 * time.Millisecond, version: 9, shared: true},
	})
	c.restartAll()
	fs, _ = c.takeExpired(now.Add(300*time.Millisecond), 10)
	var ended bool
	for _, f := range fs {
		ended = ended || f.kind == fireEndDelay && f.x == (expiry{"k", "a", 9})
	}
	if !ended {
		t.Fatalf("fired %+v, want the end of a's lock-delay", fs)
	}
	c.retry([]fired{{kind: fireEndDelay, x: expiry{"k", "a", 9}}}, 0)
	c.apply([]event{{kind: evDelayEnded, key: "k", owner: "a", version: 9, shared: true}})
	c.reset([]event{{kind: evGranted, key: "k", owner: "r", fence: 11, version: 10, ttl: time.Second, shared: true}, {kind: evDelayed, key: "k", owner: "s", ttl: time.Second, version: 10, shared: true}})
	if _, ok := c.remainingOf("k", "r", 11); !ok || c.size() != 2 {
		t.Fatalf("reset: %d countdowns, r's found %v", c.size(), ok)
	}
}

// TestFSM_SharedListPages: a key with Shared grants counts one entry per
// grant against a page's limit and is never split over pages.
func TestFSM_SharedListPages(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("a", "x", false))
	for _, o := range []string{"r1", "r2", "r3"} {
		h.apply(sacq("b", o, 0, false))
	}
	h.apply(acq("c", "y", false))
	page, more := h.f.listIn([]string{""}, "", 2)
	if len(page) != 1 || page[0].key != "a" || !more {
		t.Fatalf("page 1: %+v more %v, want a alone (b's 3 grants do not fit)", page, more)
	}
	page, more = h.f.listIn([]string{""}, "a", 2)
	if len(page) != 1 || page[0].key != "b" || len(page[0].grants) != 3 || !more {
		t.Fatalf("page 2: %+v more %v, want b whole", page, more)
	}
	page, more = h.f.listIn([]string{""}, "b", 2)
	if len(page) != 1 || page[0].key != "c" || more {
		t.Fatalf("page 3: %+v more %v", page, more)
	}
}
