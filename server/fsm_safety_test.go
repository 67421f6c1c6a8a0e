package server

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// lastEvent returns the last event of kind k the harness recorded.
func (h *fsmHarness) lastEvent(k eventKind) (event, bool) {
	for i := len(h.rec.evs) - 1; i >= 0; i-- {
		if h.rec.evs[i].kind == k {
			return h.rec.evs[i], true
		}
	}
	return event{}, false
}

// TestFSM_StaleExpiryAfterTTLChangeIsIgnored: an expiry proposed for the
// countdown a TTL change replaced must not end the renewed grant (the
// renewal-with-a-new-TTL versus leader-expiry race).
func TestFSM_StaleExpiryAfterTTLChangeIsIgnored(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	granted := h.idx
	h.apply(acq("k", "b", true))
	if r := h.apply(command{op: opSetTTL, key: "k", owner: "a", ttl: 2 * time.Second}); r.code != resOK {
		t.Fatalf("set TTL = %+v", r)
	}
	renewed := h.idx
	if ev, ok := h.lastEvent(evTTL); !ok || ev.version != renewed || ev.ttl != 2*time.Second {
		t.Fatalf("TTL event = %+v, want version %d and ttl 2s", ev, renewed)
	}
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", granted}}})
	if v, _ := h.f.get("k"); !v.held || v.grant.owner != "a" || v.grant.version != renewed {
		t.Fatalf("a stale expiry ended the renewed grant: %+v", v)
	}
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", renewed}}})
	if v, _ := h.f.get("k"); v.grant.owner != "b" {
		t.Fatalf("the current version's expiry did not hand over to b: %+v", v)
	}
}

// TestFSM_RetriedAcquireByHolderRenews: a repeated acquire by the current
// owner answers granted with its fence and the TTL it asked for, and
// restarts the countdown through the log (a new version).
func TestFSM_RetriedAcquireByHolderRenews(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	fence := h.idx
	c := acq("k", "a", false)
	c.ttl = time.Hour
	r := h.apply(c)
	if r.code != resGranted || r.fence != fence || r.ttl != time.Hour {
		t.Fatalf("retried acquire = %+v, want granted, fence %d, ttl 1h", r, fence)
	}
	ev, ok := h.lastEvent(evTTL)
	if !ok || ev.version != h.idx || ev.ttl != time.Hour || ev.owner != "a" {
		t.Fatalf("retry did not restart the countdown: %+v", ev)
	}
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", fence}}})
	if v, _ := h.f.get("k"); !v.held || v.grant.owner != "a" {
		t.Fatal("an expiry of the pre-retry countdown ended the grant")
	}
}

// TestFSM_TryOfQueuedOwnerIsRefused: a non-waiting acquire by an owner that
// is queued on the key is refused (it used to answer "queued" without a
// registered wait, which crashed the server).
func TestFSM_TryOfQueuedOwnerIsRefused(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	h.apply(acq("k", "b", true))
	if r := h.apply(acq("k", "b", false)); r.code != resHeld {
		t.Fatalf("try of queued owner = %+v, want held", r)
	}
	if r := h.apply(acq("k", "b", true)); r.code != resQueued || r.position != 1 {
		t.Fatalf("repeated wait of queued owner = %+v, want queued at 1", r)
	}
	if err := h.f.check(); err != nil {
		t.Fatal(err)
	}
}

// TestFSM_LockDelay: a grant lost without a release (expiry, force release)
// leaves its key granted to nobody until the delay's end entry; a release
// hands over at once; a stale end entry does nothing.
func TestFSM_LockDelay(t *testing.T) {
	h := newFSMHarness(t)
	c := acq("k", "a", false)
	c.lockDelay = 500 * time.Millisecond
	h.apply(c)
	h.apply(acq("k", "b", true))
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", h.idx - 1}}})
	delayed := h.idx
	v, ok := h.f.get("k")
	if !ok || v.held || v.waiters != 1 {
		t.Fatalf("after expiry: %+v %v, want in lock-delay with b waiting", v, ok)
	}
	if ev, ok := h.lastEvent(evDelayed); !ok || ev.version != delayed || ev.ttl != 500*time.Millisecond {
		t.Fatalf("delay event = %+v", ev)
	}
	if r := h.apply(acq("k", "c", false)); r.code != resDelayed {
		t.Fatalf("try during the lock-delay = %+v, want delayed", r)
	}
	if r := h.apply(command{op: opRelease, key: "k", owner: "a"}); r.code != resLost {
		t.Fatalf("release by the lost holder = %+v, want lost", r)
	}
	h.apply(command{op: opEndDelay, key: "k", version: delayed - 1})
	if v, _ := h.f.get("k"); v.held {
		t.Fatal("a stale end-of-delay granted the key")
	}
	h.apply(command{op: opEndDelay, key: "k", version: delayed})
	v, _ = h.f.get("k")
	if !v.held || v.grant.owner != "b" || v.grant.fence != h.idx {
		t.Fatalf("end of delay: %+v, want b granted with fence %d", v, h.idx)
	}
	// b asked for no lock-delay: its release and its expiry hand over or free at once.
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "b", v.grant.version}}})
	if _, ok := h.f.get("k"); ok {
		t.Fatal("a grant without lock-delay left its key in a delay")
	}
	// A voluntary release never delays.
	h.apply(c)
	h.apply(acq("k", "d", true))
	h.apply(command{op: opRelease, key: "k", owner: "a"})
	if v, _ := h.f.get("k"); !v.held || v.grant.owner != "d" {
		t.Fatalf("release with a lock-delay did not hand over at once: %+v", v)
	}
	// Force release delays; the end with nobody waiting frees the key.
	h.apply(command{op: opRelease, key: "k", owner: "d"})
	h.apply(c)
	if r := h.apply(command{op: opForceRelease, key: "k"}); r.code != resOK || r.removed.owner != "a" || r.fence != 0 {
		t.Fatalf("force release = %+v", r)
	}
	if v, ok := h.f.get("k"); !ok || v.held {
		t.Fatalf("after force release: %+v %v, want in lock-delay", v, ok)
	}
	h.apply(command{op: opEndDelay, key: "k", version: h.idx})
	if _, ok := h.f.get("k"); ok {
		t.Fatal("end of delay with nobody waiting left the key")
	}
	if err := h.f.check(); err != nil {
		t.Fatal(err)
	}
}

// TestFSM_ForceRelease hands the key to the head waiter with a greater
// fence, tells the observer why, and refuses a free key.
func TestFSM_ForceRelease(t *testing.T) {
	h := newFSMHarness(t)
	if r := h.apply(command{op: opForceRelease, key: "k"}); r.code != resLost {
		t.Fatalf("force release of a free key = %+v, want lost", r)
	}
	h.apply(acq("k", "a", false))
	first := h.idx
	h.apply(acq("k", "b", true))
	r := h.apply(command{op: opForceRelease, key: "k"})
	if r.code != resOK || r.removed.owner != "a" || r.removed.fence != first || r.fence != h.idx {
		t.Fatalf("force release = %+v", r)
	}
	for _, ev := range h.rec.evs {
		if ev.kind == evRemoved && ev.owner == "a" && ev.reason != reasonForced {
			t.Fatalf("a's removal reason = %v, want forced", ev.reason)
		}
	}
}

// TestFSM_QueueOperationsDoNotCopy: cancelling 10,000 waiters of one key,
// from the back, allocates almost nothing (it used to copy the queue on
// every cancel: 3.1 GB).
func TestFSM_QueueOperationsDoNotCopy(t *testing.T) {
	f := newFSM(nil)
	idx := uint64(1)
	apply := func(c command) applyResult {
		idx++
		r, _ := f.apply(idx, &c, nil)
		return r
	}
	apply(command{op: opAcquire, key: "k", owner: "holder", ttl: time.Second, maxWaiters: 20000, maxLeases: 10})
	const n = 10000
	for i := range n {
		if r := apply(command{op: opAcquire, key: "k", owner: fmt.Sprintf("w%05d", i), ttl: time.Second, wait: true, maxWaiters: 20000, maxLeases: 10}); r.code != resQueued || r.position != i+1 {
			t.Fatalf("waiter %d: %+v", i, r)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := n - 1; i >= 0; i -= 2 {
		if r := apply(command{op: opCancelWait, key: "k", owner: fmt.Sprintf("w%05d", i)}); !r.dequeued {
			t.Fatalf("cancel %d: %+v", i, r)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("cancelling %d waiters allocated %d MiB", n/2, got>>20)
	}
	if err := f.check(); err != nil {
		t.Fatal(err)
	}
	// The remaining waiters are granted in their order.
	apply(command{op: opRelease, key: "k", owner: "holder"})
	if v, _ := f.get("k"); v.grant.owner != "w00000" || v.waiters != n/2-1 {
		t.Fatalf("after release: %+v", v)
	}
}

// TestFSM_ListPages: pages follow the ordered index, honour the prefix,
// skip keys in a lock-delay, and say when more follow.
func TestFSM_ListPages(t *testing.T) {
	h := newFSMHarness(t)
	for i := range 5 {
		c := acq(fmt.Sprintf("a/%d", i), "o", false)
		c.maxLeases = 100
		h.apply(c)
	}
	c := acq("b", "o", false)
	c.maxLeases, c.lockDelay = 100, time.Second
	h.apply(c)
	h.apply(command{op: opForceRelease, key: "b"})
	c = acq("a", "o", false)
	c.maxLeases = 100
	h.apply(c)
	page, more := h.f.list("a/", "", 2)
	if len(page) != 2 || page[0].key != "a/0" || page[1].key != "a/1" || !more {
		t.Fatalf("first page %+v more=%v", page, more)
	}
	page, more = h.f.list("a/", "a/3", 2)
	if len(page) != 1 || page[0].key != "a/4" || more {
		t.Fatalf("last page %+v more=%v", page, more)
	}
	page, _ = h.f.list("", "", 100)
	var keys []string
	for _, p := range page {
		keys = append(keys, p.key)
	}
	if fmt.Sprint(keys) != "[a a/0 a/1 a/2 a/3 a/4]" {
		t.Fatalf("all keys %v (b is in its lock-delay and not held)", keys)
	}
}

// TestFSM_VersionOneEntriesDecode: log entries written before command
// version 2 still apply (their expiries match any grant version).
func TestFSM_VersionOneEntriesDecode(t *testing.T) {
	e := enc{}
	e.byte1(1)
	e.byte1(byte(opAcquire))
	for _, s := range []string{"k", "owner-a", "h", ""} {
		e.str(s)
	}
	e.dur(time.Second)
	e.boolean(false)
	e.u64(10)
	e.u64(10)
	c, err := decodeCommand(e.b)
	if err != nil || c.op != opAcquire || c.key != "k" || c.owner != "owner-a" || c.ttl != time.Second || c.lockDelay != 0 || c.maxTotalWaiters != 0 {
		t.Fatalf("v1 acquire = %+v, %v", c, err)
	}
	x := enc{}
	x.byte1(1)
	x.byte1(byte(opExpire))
	x.u64(1)
	x.str("k")
	x.str("owner-a")
	c, err = decodeCommand(x.b)
	if err != nil || len(c.expiries) != 1 || c.expiries[0] != (expiry{"k", "owner-a", 0}) {
		t.Fatalf("v1 expire = %+v, %v", c, err)
	}
	for _, op := range []opcode{opForceRelease, opEndDelay, opUnclaimed, opNoop} {
		if _, err := decodeCommand([]byte{1, byte(op), 1, 'k', 1}); err == nil {
			t.Fatalf("op %d decoded as version 1", op)
		}
	}
}

// FuzzFSMApply applies random command sequences and checks the table's
// invariants after each: one holder per key, queue entries unique and
// consistent, fences strictly increasing per key, and a snapshot restoring
// to the same table.
func FuzzFSMApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add(bytes.Repeat([]byte{0, 17, 34, 51, 68, 85, 102, 119, 136, 153}, 8))
	f.Add([]byte{0x10, 0x21, 0x32, 0x03, 0x74, 0x85, 0x96, 0x07, 0x48, 0x59})
	// Shared grants: permits of 2 and readers, a writer waiting, releases,
	// expiries with a lock-delay, their end, cancels and a force release.
	f.Add([]byte{1, 0x60, 1, 0x61, 1, 0x62, 1, 0x03, 1, 0x60, 2, 0x60, 3, 0x61, 2, 0x62, 4, 0x03, 1, 0x6a, 3, 0x6a, 7, 0x6a, 1, 0x21, 1, 0x22, 6, 0x00, 1, 0x23})
	f.Add([]byte{1, 0x20, 1, 0x21, 1, 0x02, 1, 0x23, 2, 0x20, 2, 0x21, 5, 0x23, 9, 0x23, 8, 0x23, 1, 0x28, 3, 0x28, 7, 0x28, 10, 0x02, 4, 0x02})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := &recorder{}
		fm := newFSM(rec)
		var idx uint64
		lastFence := map[string]uint64{}
		owners := []string{"o0", "o1", "o2", "o3"}
		keys := []string{"k0", "k1"}
		version := func(key, owner string) uint64 {
			fm.mu.RLock()
			if e := fm.locks.get(key); e != nil && e.shared[owner] != nil {
				defer fm.mu.RUnlock()
				return e.shared[owner].version
			}
			fm.mu.RUnlock()
			if v, ok := fm.get(key); ok {
				if v.held {
					return v.grant.version
				}
				fm.mu.RLock()
				defer fm.mu.RUnlock()
				return fm.locks.get(key).delayVersion
			}
			return 0
		}
		for i := 0; i+1 < len(data) && i < 400; i += 2 {
			b, arg := data[i], data[i+1]
			key, owner := keys[int(arg>>4)%len(keys)], owners[int(arg)%len(owners)]
			var c command
			switch b % 11 {
			case 0, 1:
				c = command{op: opAcquire, key: key, owner: owner, ttl: time.Second, wait: b%2 == 1, maxWaiters: 3, maxLeases: 10, maxTotalWaiters: 5}
				if arg&8 != 0 {
					c.lockDelay = time.Second
				}
				if arg&4 != 0 {
					c.ttl = 2 * time.Second
				}
				if arg&0x20 != 0 { // a Shared grant: a reader, or a permit of 2
					c.shared = true
					if arg&0x40 != 0 {
						c.limit = 2
					}
				}
			case 2:
				c = command{op: opRelease, key: key, owner: owner}
			case 3:
				c = command{op: opExpire, expiries: []expiry{{key, owner, version(key, owner)}}}
			case 4:
				c = command{op: opCancelWait, key: key, owner: owner}
			case 5:
				c = command{op: opSetTTL, key: key, owner: owner, ttl: 3 * time.Second}
			case 6:
				c = command{op: opForceRelease, key: key}
			case 7:
				c = command{op: opEndDelay, key: key, version: version(key, "") - uint64(arg&1)}
				if arg&0x20 != 0 {
					c = command{op: opEndSharedDelay, key: key, owner: owner, version: version(key, owner) - uint64(arg&1)}
				}
			case 8:
				c = command{op: opUnclaimed, expiries: []expiry{{key, owner, version(key, owner) - uint64(arg&1)}}}
			case 9:
				c = command{op: opSuspect, suspects: []suspectMark{{key, owner, version(key, owner) - uint64(arg&1), time.Duration(arg) * time.Millisecond}}}
			case 10:
				var since uint64
				fm.mu.RLock()
				if e := fm.locks.get(key); e != nil {
					if n := e.q.find(owner); n != nil {
						since = n.since - uint64(arg&1)
					}
				}
				fm.mu.RUnlock()
				c = command{op: opPurgeIdle, idle: []idleEntry{{key, owner, since}}}
			}
			idx++
			rec.evs = rec.evs[:0]
			if r := fm.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: c.encode()}).(applyResult); r.code == resBadCommand {
				t.Fatalf("command %+v did not decode", c)
			}
			if err := fm.check(); err != nil {
				t.Fatalf("after %+v: %v", c, err)
			}
			for _, ev := range rec.evs {
				if ev.kind == evGranted {
					if ev.fence <= lastFence[ev.key] {
						t.Fatalf("key %s: fence %d after %d", ev.key, ev.fence, lastFence[ev.key])
					}
					lastFence[ev.key] = ev.fence
				}
			}
			// Shared grants: never with an Exclusive grant, at most the
			// key's limit (check verifies these too, and that no head
			// waiter is left that could be granted); queue entries unique.
			for _, k := range keys {
				fm.mu.RLock()
				if e := fm.locks.get(k); e != nil {
					if e.held && len(e.shared) > 0 || e.limit > 0 && len(e.shared) > e.limit {
						t.Fatalf("key %s: exclusive %v with %d shared grants (limit %d)", k, e.held, len(e.shared), e.limit)
					}
					seen := map[string]bool{}
					e.q.each(func(w *waiter) {
						if seen[w.owner] {
							t.Errorf("key %s: %s queued twice", k, w.owner)
						}
						seen[w.owner] = true
					})
				}
				fm.mu.RUnlock()
			}
		}
		restored := snapshotRestored(t, fm)
		if err := restored.check(); err != nil {
			t.Fatal(err)
		}
		if a, _ := restored.appliedIndex(); a != idx {
			t.Fatalf("restored applied index %d, want %d", a, idx)
		}
	})
}

// TestLeaseClock_TTLChangeRacingExpiry: a TTL change applied after its
// countdown was taken as expired puts the countdown back, restarted, with
// the new version (the FSM ignores the stale expiry).
func TestLeaseClock_TTLChangeRacingExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, 0)
	c.apply([]event{{kind: evGranted, key: "k", owner: "a", fence: 5, version: 5, ttl: 100 * time.Millisecond}})
	now = now.Add(100 * time.Millisecond)
	fs, _ := c.takeExpired(now, 10)
	if len(fs) != 1 || fs[0].x.version != 5 {
		t.Fatalf("takeExpired = %+v", fs)
	}
	c.apply([]event{{kind: evTTL, key: "k", owner: "a", version: 9, ttl: 2 * time.Second}})
	if got := c.renew("k", "a", 0, now.Add(time.Second)); got != renewOK {
		t.Fatalf("renew after the TTL change = %v, want ok", got)
	}
	if fs, next := c.takeExpired(now.Add(1500*time.Millisecond), 10); len(fs) != 0 || next.IsZero() {
		t.Fatalf("restarted countdown expired early: %+v", fs)
	}
}

// TestLeaseClock_WakesTheLoopOnlyForAnEarlierDue: applied events wake the
// expiry loop only when a countdown is due before the due the loop last saw
// (it wakes by then anyway); before the loop has looked, after a reset and
// after a new term, every apply wakes it.
func TestLeaseClock_WakesTheLoopOnlyForAnEarlierDue(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, time.Second)
	woke := func() bool {
		select {
		case <-c.wake:
			return true
		default:
			return false
		}
	}
	grant := func(key string, version uint64, ttl time.Duration, handoff bool) {
		c.apply([]event{{kind: evGranted, key: key, owner: "o-" + key, fence: version, version: version, ttl: ttl, handoff: handoff}})
	}
	grant("a", 1, 10*time.Second, false)
	if !woke() {
		t.Fatal("first grant, before the loop looked: no wake")
	}
	if _, next := c.takeExpired(now, 10); !next.Equal(now.Add(4 * time.Second)) {
		t.Fatalf("next due %v, want a's suspicion check 4s on", next.Sub(now))
	}
	steps := []struct {
		what string
		do   func()
		want bool
	}{
		{"a later grant", func() { grant("b", 2, 20*time.Second, false) }, false},
		{"a release", func() { c.apply([]event{{kind: evRemoved, key: "a", owner: "o-a"}}) }, false},
		{"an earlier grant", func() { grant("c", 3, time.Second, false) }, true},
		{"a handover due at its claim window, after c's check", func() { grant("d", 4, time.Minute, true) }, false},
		{"a shorter TTL through the log", func() {
			c.apply([]event{{kind: evTTL, key: "b", owner: "o-b", version: 5, ttl: 200 * time.Millisecond}})
		}, true},
		{"a lock-delay due later", func() { c.apply([]event{{kind: evDelayed, key: "e", version: 6, ttl: 100 * time.Millisecond}}) }, false},
		{"a lock-delay due sooner", func() { c.apply([]event{{kind: evDelayed, key: "f", version: 7, ttl: 50 * time.Millisecond}}) }, true},
	}
	for _, st := range steps {
		st.do()
		got := woke()
		if got != st.want {
			t.Errorf("%s: woke %v, want %v", st.what, got, st.want)
		}
		if got {
			c.takeExpired(now, 10) // what the woken loop does
		}
	}
	// A new term restarts every countdown: the next apply wakes the loop,
	// whatever it is due, until the loop has looked again.
	c.restartAll()
	woke()
	grant("g", 8, time.Hour, false)
	if !woke() {
		t.Error("after a new term: no wake")
	}
	c.takeExpired(now, 10)
	grant("h", 9, time.Hour, false)
	if woke() {
		t.Error("after the loop looked again: a later grant woke it")
	}
}

// TestLeaseClock_ClaimWindow: a handed-over grant that is not renewed within
// the claim window fires as unclaimed; a renewal claims it; a new term
// forgets claims (late, never early).
func TestLeaseClock_ClaimWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, time.Second)
	c.apply([]event{
		{kind: evGranted, key: "a", owner: "x", fence: 1, version: 1, ttl: time.Minute, handoff: true},
		{kind: evGranted, key: "b", owner: "y", fence: 2, version: 2, ttl: time.Minute, handoff: true},
		{kind: evGranted, key: "c", owner: "z", fence: 3, version: 3, ttl: time.Minute},
	})
	if got := c.renew("b", "y", 0, now.Add(500*time.Millisecond)); got != renewOK {
		t.Fatalf("claim of b = %v", got)
	}
	fs, _ := c.takeExpired(now.Add(time.Second), 10)
	if len(fs) != 1 || fs[0].kind != fireUnclaimed || fs[0].x != (expiry{"a", "x", 1}) {
		t.Fatalf("after the claim window: %+v, want a unclaimed", fs)
	}
	if got := c.renew("a", "x", 0, now.Add(time.Second)); got != renewLost {
		t.Fatalf("late claim = %v, want lost", got)
	}
	c.apply([]event{{kind: evGranted, key: "d", owner: "w", fence: 4, version: 4, ttl: time.Minute, handoff: true}})
	c.restartAll()
	if fs, _ := c.takeExpired(now.Add(30*time.Second), 10); len(endsOnly(fs)) != 0 {
		t.Fatalf("a new term released %+v before its TTL", fs)
	}
}

// TestLeaseClock_LockDelay: a lock-delay fires as an end-of-delay with its
// version and reports its time left.
func TestLeaseClock_LockDelay(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, 0)
	c.apply([]event{{kind: evDelayed, key: "k", version: 7, ttl: time.Second}})
	if left, ok := c.delayRemaining("k"); !ok || left != time.Second {
		t.Fatalf("delay left %v %v", left, ok)
	}
	if got := c.renew("k", "", 0, now); got != renewLost {
		t.Fatalf("renew of a delay = %v", got)
	}
	fs, _ := c.takeExpired(now.Add(time.Second), 10)
	if len(fs) != 1 || fs[0].kind != fireEndDelay || fs[0].x.version != 7 {
		t.Fatalf("takeExpired = %+v", fs)
	}
	c.apply([]event{{kind: evDelayEnded, key: "k", version: 7}})
	if c.size() != 0 {
		t.Fatal("delay countdown kept after its end")
	}
}

// TestLeaseClock_ShorterTTLNeverBringsEndForward: a renewal or TTL change
// to a shorter TTL keeps the end already acknowledged, in memory and after
// a new term (which restarts with the grant's longest TTL).
func TestLeaseClock_ShorterTTLNeverBringsEndForward(t *testing.T) {
	h := newFSMHarness(t)
	c := acq("k", "a", false)
	c.ttl = 400 * time.Millisecond
	h.apply(c)
	h.apply(command{op: opSetTTL, key: "k", owner: "a", ttl: 100 * time.Millisecond})
	if v, _ := h.f.get("k"); v.grant.ttl != 100*time.Millisecond || v.grant.restartTTL != 400*time.Millisecond {
		t.Fatalf("after shortening: ttl %v restart %v, want 100ms and 400ms", v.grant.ttl, v.grant.restartTTL)
	}

	now := time.Unix(1000, 0)
	clk := newLeaseClock(func() time.Time { return now }, 0)
	clk.apply([]event{{kind: evGranted, key: "k", owner: "a", fence: 1, version: 1, ttl: 400 * time.Millisecond, restartTTL: 400 * time.Millisecond}})
	now = now.Add(50 * time.Millisecond)
	clk.apply([]event{{kind: evTTL, key: "k", owner: "a", fence: 1, version: 2, ttl: 100 * time.Millisecond, restartTTL: 400 * time.Millisecond}})
	if got := clk.renew("k", "a", 0, now.Add(10*time.Millisecond)); got != renewOK {
		t.Fatalf("renew = %v", got)
	}
	if fs, next := clk.takeExpired(now.Add(300*time.Millisecond), 10); len(endsOnly(fs)) != 0 || next.Before(time.Unix(1000, 0).Add(400*time.Millisecond)) {
		t.Fatalf("the shorter TTL brought the end forward: fired %+v, next %v", fs, next)
	}
	clk.restartAll()
	if fs, _ := clk.takeExpired(now.Add(350*time.Millisecond), 10); len(endsOnly(fs)) != 0 {
		t.Fatalf("a new term restarted with the shorter TTL: %+v", fs)
	}
}
