package server

import (
	"testing"
	"time"
)

// endsOnly returns the countdowns in fs that end something (expiry,
// unclaimed release, end of a lock-delay), without the suspect marks.
func endsOnly(fs []fired) []fired {
	var out []fired
	for _, f := range fs {
		if f.kind != fireSuspect {
			out = append(out, f)
		}
	}
	return out
}

// TestLeaseClock_SuspectAfterTwoFifths: a grant unrenewed for 2/5 of its
// TTL is marked suspect with the time its countdown has left; from then on
// its renewals need the log, and it is checkpointed every TTL/8 while it
// stays suspect; an applied logged renewal (evTTL) clears the mark.
func TestLeaseClock_SuspectAfterTwoFifths(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	c := newLeaseClock(func() time.Time { return now }, 0)
	c.apply([]event{{kind: evGranted, key: "k", owner: "a", fence: 5, version: 5, ttl: time.Second}})

	if fs, next := c.takeExpired(t0.Add(399*time.Millisecond), 10); len(fs) != 0 || !next.Equal(t0.Add(400*time.Millisecond)) {
		t.Fatalf("before 2/5 of the TTL: fired %+v, next %v", fs, next.Sub(t0))
	}
	if got := c.renew("k", "a", 0, t0.Add(399*time.Millisecond)); got != renewOK {
		t.Fatalf("renew before suspicion = %v", got)
	}
	// The renewal at 399 ms moved the check to 399 + 400 ms.
	fs, _ := c.takeExpired(t0.Add(798*time.Millisecond), 10)
	if len(fs) != 0 {
		t.Fatalf("suspect before 2/5 of the TTL since the last renewal: %+v", fs)
	}
	at := t0.Add(799 * time.Millisecond)
	fs, next := c.takeExpired(at, 10)
	if len(fs) != 1 || fs[0].kind != fireSuspect || fs[0].x != (expiry{"k", "a", 5}) || fs[0].left != 600*time.Millisecond {
		t.Fatalf("at 2/5 of the TTL: %+v, want suspect with 600ms left", fs)
	}
	if want := at.Add(125 * time.Millisecond); !next.Equal(want) {
		t.Fatalf("next checkpoint at %v, want %v", next.Sub(t0), want.Sub(t0))
	}
	if !c.isSuspect("k", "a") {
		t.Fatal("not marked suspect")
	}
	if got := c.renew("k", "a", 0, at); got != renewNeedsLog {
		t.Fatalf("renew of a suspect grant = %v, want needs log", got)
	}
	// A failed suspect entry does not clear the mark.
	c.retry(fs, 100*time.Millisecond)
	if got := c.renew("k", "a", 0, at.Add(time.Millisecond)); got != renewNeedsLog {
		t.Fatalf("renew after a failed suspect entry = %v, want needs log", got)
	}
	fs, _ = c.takeExpired(at.Add(125*time.Millisecond), 10)
	if len(fs) != 1 || fs[0].kind != fireSuspect || fs[0].left != 475*time.Millisecond {
		t.Fatalf("checkpoint: %+v, want suspect with 475ms left", fs)
	}
	// The countdown still runs out at its deadline.
	if fs, _ = c.takeExpired(t0.Add(1398*time.Millisecond), 10); len(endsOnly(fs)) != 0 {
		t.Fatalf("fired %+v before the deadline", fs)
	}
	// A logged renewal (applied) clears the mark.
	c.apply([]event{{kind: evTTL, key: "k", owner: "a", fence: 5, version: 9, ttl: time.Second}})
	if c.isSuspect("k", "a") {
		t.Fatal("still suspect after a logged renewal")
	}
	if got := c.renew("k", "a", 0, t0.Add(1398*time.Millisecond)); got != renewOK {
		t.Fatalf("renew after the logged renewal = %v", got)
	}
}

// TestLeaseClock_LiveHolderNeverSuspect: a holder renewing every TTL/3 is
// never marked suspect, and never fires.
func TestLeaseClock_LiveHolderNeverSuspect(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	c := newLeaseClock(func() time.Time { return now }, 0)
	ttl := 900 * time.Millisecond
	c.apply([]event{{kind: evGranted, key: "k", owner: "a", fence: 1, version: 1, ttl: ttl}})
	for i := 1; i <= 30; i++ {
		now = t0.Add(time.Duration(i) * ttl / 3)
		if fs, _ := c.takeExpired(now, 10); len(fs) != 0 {
			t.Fatalf("renewal %d: fired %+v", i, fs)
		}
		if got := c.renew("k", "a", 0, now); got != renewOK {
			t.Fatalf("renewal %d = %v", i, got)
		}
	}
}

// TestLeaseClock_RestartUsesLoggedTimeLeft: a new term restarts a grant
// whose suspect entry was applied at the time left the entry logged, and
// the grant stays suspect; a grant only marked in memory (its entry never
// committed) restarts at its full TTL, not suspect.
func TestLeaseClock_RestartUsesLoggedTimeLeft(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	c := newLeaseClock(func() time.Time { return now }, 0)
	c.apply([]event{
		{kind: evGranted, key: "logged", owner: "a", fence: 1, version: 1, ttl: time.Second},
		{kind: evGranted, key: "marked", owner: "b", fence: 2, version: 2, ttl: time.Second},
	})
	now = t0.Add(400 * time.Millisecond)
	fs, _ := c.takeExpired(now, 10)
	if len(fs) != 2 {
		t.Fatalf("fired %+v, want 2 suspects", fs)
	}
	// Only "logged"'s entry is applied; one for another version is not.
	c.apply([]event{
		{kind: evSuspect, key: "logged", owner: "a", version: 1, ttl: 600 * time.Millisecond},
		{kind: evSuspect, key: "marked", owner: "b", version: 1, ttl: 600 * time.Millisecond},
	})
	now = t0.Add(500 * time.Millisecond) // the new leader's election
	c.restartAll()
	if left, _ := c.remaining("logged", 1); left != 600*time.Millisecond {
		t.Fatalf("logged suspect restarted with %v, want 600ms", left)
	}
	if left, _ := c.remaining("marked", 2); left != time.Second {
		t.Fatalf("grant marked in memory only restarted with %v, want the full TTL", left)
	}
	if !c.isSuspect("logged", "a") || c.isSuspect("marked", "b") {
		t.Fatalf("after the restart: logged suspect %v (want true), marked suspect %v (want false)", c.isSuspect("logged", "a"), c.isSuspect("marked", "b"))
	}
	// The new leader checkpoints the suspect grant from its election.
	fs, _ = c.takeExpired(now.Add(125*time.Millisecond), 10)
	if len(fs) != 1 || fs[0].x.key != "logged" || fs[0].left != 475*time.Millisecond {
		t.Fatalf("first checkpoint of the new leader: %+v", fs)
	}
	// A snapshot's state restores the same.
	c2 := newLeaseClock(func() time.Time { return now }, 0)
	c2.reset([]event{{kind: evGranted, key: "logged", owner: "a", fence: 1, version: 1, ttl: time.Second, suspect: true, left: 300 * time.Millisecond}})
	if left, _ := c2.remaining("logged", 1); left != 300*time.Millisecond || !c2.isSuspect("logged", "a") {
		t.Fatalf("reset: %v left, suspect %v", left, c2.isSuspect("logged", "a"))
	}
}

// TestFSM_SuspectOfAnOldVersionDoesNothing: a suspect entry whose version
// is not the grant's current one (a logged renewal overtook it), or names
// another owner, changes nothing; a current one marks the grant without
// changing its version, so an expiry proposed for that version still ends
// it; a logged renewal clears the mark.
func TestFSM_SuspectOfAnOldVersionDoesNothing(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	v1 := h.idx
	h.apply(command{op: opSetTTL, key: "k", owner: "a"}) // a logged renewal of a suspect grant: ttl 0 keeps the TTL
	v2 := h.idx
	if g, _ := h.f.get("k"); g.grant.version != v2 || g.grant.ttl != time.Second {
		t.Fatalf("after a logged renewal with ttl 0: %+v", g.grant)
	}
	n := len(h.rec.evs)
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "k", owner: "a", version: v1, left: 100 * time.Millisecond}}})
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "k", owner: "b", version: v2, left: 100 * time.Millisecond}}})
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "nokey", owner: "a", version: v2, left: 100 * time.Millisecond}}})
	if g, _ := h.f.get("k"); g.grant.suspect || len(h.rec.evs) != n {
		t.Fatalf("a stale suspect entry changed the grant: %+v, events %+v", g.grant, h.rec.evs[n:])
	}
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "k", owner: "a", version: v2, left: 300 * time.Millisecond}}})
	g, _ := h.f.get("k")
	if !g.grant.suspect || g.grant.suspectLeft != 300*time.Millisecond || g.grant.version != v2 {
		t.Fatalf("current suspect entry: %+v", g.grant)
	}
	if ev, ok := h.lastEvent(evSuspect); !ok || ev.version != v2 || ev.ttl != 300*time.Millisecond {
		t.Fatalf("evSuspect %+v %v", ev, ok)
	}
	if st := h.f.state(); len(st) != 1 || !st[0].suspect || st[0].left != 300*time.Millisecond {
		t.Fatalf("state %+v", st)
	}
	h.apply(command{op: opSetTTL, key: "k", owner: "a"})
	if g, _ := h.f.get("k"); g.grant.suspect || g.grant.suspectLeft != 0 {
		t.Fatalf("a logged renewal kept the suspect mark: %+v", g.grant)
	}
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "k", owner: "a", version: h.idx, left: 200 * time.Millisecond}}})
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", h.idx - 1}}})
	if _, ok := h.f.get("k"); ok {
		t.Fatal("an expiry of the suspect grant's version did not end it")
	}
	if err := h.f.check(); err != nil {
		t.Fatal(err)
	}
}

// TestFSM_PurgeIdleSparesReattachedWaiters: a purge of queue entries past
// their grace removes only those whose since it names: a waiter that
// re-attached (an acquisition with wait of the queued owner) keeps its
// place.
func TestFSM_PurgeIdleSparesReattachedWaiters(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "holder", false))
	h.apply(acq("k", "a", true))
	sinceA := h.idx
	h.apply(acq("k", "b", true))
	sinceB := h.idx
	h.apply(acq("k", "c", true))
	if r := h.apply(acq("k", "a", true)); r.code != resQueued || r.position != 1 {
		t.Fatalf("re-attach of a: %+v, want queued at 1", r)
	}
	h.apply(command{op: opPurgeIdle, idle: []idleEntry{{"k", "a", sinceA}, {"k", "b", sinceB}}})
	if r := h.apply(acq("k", "c", true)); r.code != resQueued || r.position != 2 {
		t.Fatalf("c after the purge: %+v, want queued at 2 (a kept, b removed)", r)
	}
	h.apply(command{op: opRelease, key: "k", owner: "holder"})
	if g, _ := h.f.get("k"); g.grant.owner != "a" {
		t.Fatalf("granted to %q, want a", g.grant.owner)
	}
	if err := h.f.check(); err != nil {
		t.Fatal(err)
	}
}

// TestFSM_SuspectSnapshotRoundTrip: a snapshot keeps each grant's suspect
// entry and each waiter's since, and the restored FSM applies the same
// stale-version rule.
func TestFSM_SuspectSnapshotRoundTrip(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	v := h.idx
	h.apply(acq("k", "b", true))
	h.apply(acq("j", "c", false))
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "k", owner: "a", version: v, left: 250 * time.Millisecond}}})
	restored := snapshotRestored(t, h.f)
	g, _ := restored.get("k")
	if !g.grant.suspect || g.grant.suspectLeft != 250*time.Millisecond {
		t.Fatalf("restored grant %+v", g.grant)
	}
	if q := restored.queued(); len(q) != 1 || q[0].since != v+1 || q[0].ttl != time.Second {
		t.Fatalf("restored queue %+v", q)
	}
	if j, _ := restored.get("j"); j.grant.suspect {
		t.Fatalf("restored j suspect: %+v", j.grant)
	}
}
