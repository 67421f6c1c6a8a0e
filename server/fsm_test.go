package server

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// recorder is an observer that keeps every event.
type recorder struct{ evs []event }

func (r *recorder) lockEvents(evs []event)    { r.evs = append(r.evs, evs...) }
func (r *recorder) lockReset(holders []event) {}
func (r *recorder) undecodable(uint64, error) {}

// fsmHarness applies commands at increasing log indexes.
type fsmHarness struct {
	t   *testing.T
	f   *fsm
	rec *recorder
	idx uint64
	log []*raft.Log
}

func newFSMHarness(t *testing.T) *fsmHarness {
	rec := &recorder{}
	return &fsmHarness{t: t, f: newFSM(rec), rec: rec, idx: 10}
}

func (h *fsmHarness) apply(c command) applyResult {
	h.t.Helper()
	h.idx++
	l := &raft.Log{Index: h.idx, Term: 1, Type: raft.LogCommand, Data: c.encode()}
	h.log = append(h.log, l)
	r, ok := h.f.Apply(l).(applyResult)
	if !ok {
		h.t.Fatalf("Apply returned %T", h.f.Apply(l))
	}
	return r
}

func acq(key, owner string, wait bool) command {
	return command{op: opAcquire, key: key, owner: owner, ttl: time.Second, wait: wait, maxWaiters: 3, maxLeases: 5}
}

func TestFSM_GrantQueueHandoffFIFO(t *testing.T) {
	h := newFSMHarness(t)
	r := h.apply(acq("k", "a", false))
	if r.code != resGranted || r.fence != h.idx {
		t.Fatalf("first acquire = %+v, want granted with fence = log index %d", r, h.idx)
	}
	if r := h.apply(acq("k", "b", false)); r.code != resHeld {
		t.Fatalf("try on held key = %+v, want held", r)
	}
	for i, o := range []string{"b", "c", "d"} {
		if r := h.apply(acq("k", o, true)); r.code != resQueued || r.position != i+1 {
			t.Fatalf("wait %s = %+v, want queued at %d", o, r, i+1)
		}
	}
	if r := h.apply(acq("k", "e", true)); r.code != resTooManyWaiters {
		t.Fatalf("4th waiter = %+v, want too many waiters", r)
	}
	if r := h.apply(acq("k", "c", true)); r.code != resQueued || r.position != 2 {
		t.Fatalf("retried wait = %+v, want the same queue position 2", r)
	}
	if r := h.apply(acq("k", "a", false)); r.code != resGranted || r.fence != 11 {
		t.Fatalf("retried acquire by the holder = %+v, want its grant (fence 11)", r)
	}
	if r := h.apply(command{op: opRelease, key: "k", owner: "zz"}); r.code != resLost {
		t.Fatalf("release by a stranger = %+v, want lost", r)
	}
	var fences []uint64
	for _, o := range []string{"a", "b", "c", "d"} {
		r := h.apply(command{op: opRelease, key: "k", owner: o})
		if r.code != resOK {
			t.Fatalf("release by %s = %+v", o, r)
		}
		v, held := h.f.get("k")
		if o == "d" {
			if held || r.fence != 0 {
				t.Fatalf("after the last release: held=%v next=%d", held, r.fence)
			}
			break
		}
		if !held || v.grant.fence != h.idx || r.fence != h.idx {
			t.Fatalf("release by %s: next holder %+v, want fence %d from the same entry", o, v, h.idx)
		}
		fences = append(fences, v.grant.fence)
	}
	if !sort.SliceIsSorted(fences, func(i, j int) bool { return fences[i] < fences[j] }) {
		t.Fatalf("fences %v not increasing", fences)
	}
	// Order of grants seen by the observer is FIFO.
	var order []string
	for _, ev := range h.rec.evs {
		if ev.kind == evGranted {
			order = append(order, ev.owner)
		}
	}
	if want := []string{"a", "b", "c", "d"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("grant order %v, want %v", order, want)
	}
	if held, waiting := h.f.counts(); held != 0 || waiting != 0 {
		t.Fatalf("counts %d %d, want 0 0", held, waiting)
	}
}

func TestFSM_ExpireActsOnlyOnCurrentOwner(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	h.apply(command{op: opRelease, key: "k", owner: "a"})
	h.apply(acq("k", "b", false))
	bFence := h.idx
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "a", 0}, {"missing", "x", 0}}})
	if v, ok := h.f.get("k"); !ok || v.grant.owner != "b" || v.grant.fence != bFence {
		t.Fatalf("a stale expire touched b's grant: %+v %v", v, ok)
	}
	h.apply(acq("k", "c", true))
	h.apply(command{op: opExpire, expiries: []expiry{{"k", "b", bFence}}})
	v, ok := h.f.get("k")
	if !ok || v.grant.owner != "c" || v.grant.fence != h.idx {
		t.Fatalf("expire did not hand off to c in the same entry: %+v", v)
	}
	last := h.rec.evs[len(h.rec.evs)-2]
	if last.kind != evRemoved || last.reason != reasonExpired || last.owner != "b" {
		t.Fatalf("expected b's removal by expiry, got %+v", last)
	}
}

func TestFSM_CancelWaitAndRacedGrant(t *testing.T) {
	h := newFSMHarness(t)
	h.apply(acq("k", "a", false))
	h.apply(acq("k", "b", true))
	h.apply(acq("k", "c", true))
	if r := h.apply(command{op: opCancelWait, key: "k", owner: "b"}); !r.dequeued || r.released {
		t.Fatalf("cancel queued b = %+v, want dequeued", r)
	}
	h.apply(command{op: opRelease, key: "k", owner: "a"}) // c is granted
	if r := h.apply(command{op: opCancelWait, key: "k", owner: "c"}); !r.released {
		t.Fatalf("cancel of c after its grant = %+v, want released", r)
	}
	if _, held := h.f.get("k"); held {
		t.Fatal("key still held after the raced grant was released")
	}
	if r := h.apply(command{op: opCancelWait, key: "k", owner: "c"}); r.released || r.dequeued {
		t.Fatalf("second cancel = %+v, want a no-op", r)
	}
	// Purge removes queue entries only, never grants.
	h.apply(acq("k", "d", false))
	h.apply(acq("k", "e", true))
	h.apply(command{op: opPurge, pairs: []keyOwner{{"k", "d"}, {"k", "e"}}})
	if v, held := h.f.get("k"); !held || v.grant.owner != "d" || v.waiters != 0 {
		t.Fatalf("after purge: %+v held=%v, want d holding, no waiters", v, held)
	}
}

func TestFSM_LimitsAndBadCommands(t *testing.T) {
	h := newFSMHarness(t)
	for i := range 5 {
		if r := h.apply(acq(fmt.Sprint(i), "a", false)); r.code != resGranted {
			t.Fatalf("acquire %d: %+v", i, r)
		}
	}
	if r := h.apply(acq("6", "a", false)); r.code != resTooManyLeases {
		t.Fatalf("6th lease = %+v, want too many leases", r)
	}
	before := dump(h.f)
	for _, data := range [][]byte{nil, {}, {1}, {1, 99}, {2, 1}, {1, byte(opAcquire), 200}, {1, byte(opExpire), 0xff, 0xff, 0xff, 0x7f}} {
		h.idx++
		r := h.f.Apply(&raft.Log{Index: h.idx, Type: raft.LogCommand, Data: data})
		if r.(applyResult).code != resBadCommand {
			t.Fatalf("garbage %v = %+v, want bad command", data, r)
		}
	}
	h.idx++
	if r := h.f.Apply(&raft.Log{Index: h.idx, Type: raft.LogConfiguration}); r != nil {
		t.Fatalf("configuration entry result %v, want nil", r)
	}
	if after := dump(h.f); after != before {
		t.Fatalf("bad commands changed the state:\n%s\n%s", before, after)
	}
}

// dump renders the table in key order, for comparisons.
func dump(f *fsm) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	keys := make([]string, 0, f.locks.len())
	for k := range f.locks.all() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		e := f.locks.get(k)
		fmt.Fprintf(&b, "%q held=%v %s delay=%v/%d", k, e.held, grantText(&e.grant), e.delay, e.delayVersion)
		e.q.each(func(w *waiter) { fmt.Fprintf(&b, " %s", waiterText(w)) })
		if len(e.shared) > 0 || e.nsw > 0 {
			fmt.Fprintf(&b, " limit=%d nsw=%d", e.limit, e.nsw)
			for _, g := range sortedShared(e) {
				fmt.Fprintf(&b, " shared%s", grantText(&g))
			}
		}
		b.WriteString("\n")
	}
	// The last fence matters when it is ahead of the applied index: a
	// snapshot written in v3 (no Shared grants, last fence not ahead)
	// restores a smaller one that issues the same fences from the next
	// index on.
	var ahead uint64
	if f.lastFence > f.applied {
		ahead = f.lastFence
	}
	fmt.Fprintf(&b, "waiting=%d fenceAhead=%d shared=%d/%d\n", f.waiting, ahead, f.nshared, f.sharedKeys)
	return b.String()
}

// grantText prints g with its holder and session (not the address of
// their shared pair).
func grantText(g *grant) string {
	c := *g
	c.p = nil
	return fmt.Sprintf("%+v holder=%q session=%q", c, g.holder(), g.session())
}

// waiterText prints w as grantText prints a grant.
func waiterText(w *waiter) string {
	c := *w
	c.p = nil
	return fmt.Sprintf("%+v holder=%q session=%q", c, w.holder(), w.session())
}

type memSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { return nil }

// snapshotRestored snapshots f, restores the snapshot into a new FSM, fails
// t unless both dump the same table, and returns the restored FSM.
func snapshotRestored(t testing.TB, f *fsm) *fsm {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	restored := newFSM(nil)
	if err := restored.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if a, b := dump(f), dump(restored); a != b {
		t.Fatalf("restore differs:\n%s\n%s", a, b)
	}
	return restored
}

func TestFSM_SnapshotRestoreAndDeterminism(t *testing.T) {
	h := newFSMHarness(t)
	for i := range 50 {
		k := fmt.Sprintf("key/%d 🔒", i%7)
		h.apply(command{op: opAcquire, key: k, owner: fmt.Sprint("o", i), holder: "host:1", session: "s", ttl: time.Duration(i+1) * time.Second, wait: i%3 != 0, maxWaiters: 10, maxLeases: 100})
		if i%5 == 0 {
			h.apply(command{op: opRelease, key: k, owner: fmt.Sprint("o", i-5)})
		}
		if i%11 == 0 {
			h.apply(command{op: opExpire, expiries: []expiry{{k, fmt.Sprint("o", i-7), 0}}})
		}
	}
	// Replaying the same log on another FSM gives the same table.
	other := newFSM(nil)
	if rs := other.ApplyBatch(h.log); len(rs) != len(h.log) {
		t.Fatalf("%d results for %d entries", len(rs), len(h.log))
	}
	if a, b := dump(h.f), dump(other); a != b {
		t.Fatalf("replay differs:\n%s\n%s", a, b)
	}
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	restored := newFSM(&recorder{})
	if err := restored.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if a, b := dump(h.f), dump(restored); a != b {
		t.Fatalf("restore differs:\n%s\n%s", a, b)
	}
	// A corrupt snapshot is refused and leaves the table alone.
	for _, n := range []int{0, 5, len(sink.Bytes()) / 2} {
		if err := restored.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()[:n]))); err == nil {
			t.Fatalf("truncated snapshot (%d bytes) restored", n)
		}
	}
	if a, b := dump(h.f), dump(restored); a != b {
		t.Fatal("a refused snapshot changed the table")
	}
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add((&command{op: opAcquire, key: "k", owner: "o", ttl: time.Second, wait: true}).encode())
	f.Add((&command{op: opExpire, expiries: []expiry{{"a", "b", 7}}}).encode())
	f.Add((&command{op: opPurge, pairs: []keyOwner{{"a", "b"}}}).encode())
	f.Add((&command{op: opEndDelay, key: "k", version: 9}).encode())
	f.Add((&command{op: opForceRelease, key: "k"}).encode())
	f.Add((&command{op: opNoop}).encode())
	f.Add((&command{op: opSuspect, suspects: []suspectMark{{"k", "o", 7, time.Second}}}).encode())
	f.Add((&command{op: opPurgeIdle, idle: []idleEntry{{"k", "o", 7}}}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			return
		}
		c2, err := decodeCommand(c.encode())
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encoding changed the command: %+v vs %+v (%v)", c, c2, err)
		}
	})
}

func TestLeaseClock_RenewAndExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newLeaseClock(func() time.Time { return now }, 0)
	c.apply([]event{{kind: evGranted, key: "k", owner: "a", fence: 5, version: 5, ttl: time.Second}})
	if got := c.renew("k", "b", 0, now); got != renewLost {
		t.Fatalf("renew by a stranger = %v", got)
	}
	if got := c.renew("k", "a", 2*time.Second, now); got != renewNeedsLog {
		t.Fatalf("renew with another TTL = %v, want needs log", got)
	}
	now = now.Add(900 * time.Millisecond)
	if got := c.renew("k", "a", 0, now); got != renewOK {
		t.Fatalf("renew = %v", got)
	}
	if pairs, next := c.takeExpired(now.Add(999*time.Millisecond), 10); len(endsOnly(pairs)) != 0 || !next.Equal(now.Add(time.Second)) {
		t.Fatalf("expired early: %v next %v", pairs, next)
	}
	pairs, _ := c.takeExpired(now.Add(time.Second), 10)
	if len(pairs) != 1 || pairs[0] != (fired{kind: fireExpire, x: expiry{"k", "a", 5}}) {
		t.Fatalf("takeExpired = %v", pairs)
	}
	if got := c.renew("k", "a", 0, now.Add(time.Second)); got != renewLost {
		t.Fatalf("renew of an expiring grant = %v, want lost", got)
	}
	// A new term restarts the countdown at the full TTL.
	c.restartAll()
	if got := c.renew("k", "a", 0, now); got != renewOK {
		t.Fatalf("renew after restartAll = %v", got)
	}
	c.apply([]event{{kind: evRemoved, key: "k", owner: "a"}})
	if c.size() != 0 {
		t.Fatal("countdown kept after removal")
	}
}

// TestFSM_InternerCountsUsers: shared holder and session strings are
// dropped once no grant or waiter uses them.
func TestFSM_InternerCountsUsers(t *testing.T) {
	h := newFSMHarness(t)
	for i := range 4 {
		c := acq("k", fmt.Sprint("o", i), true)
		c.holder, c.session = "host:1", "session-1"
		h.apply(c)
	}
	if r := h.f.strs.m[partyKey{"host:1", "session-1"}]; r == nil || r.n != 4 {
		t.Fatalf("holder refs = %+v, want 4", r)
	}
	h.apply(command{op: opCancelWait, key: "k", owner: "o2"})
	for _, o := range []string{"o0", "o1", "o3"} {
		h.apply(command{op: opRelease, key: "k", owner: o})
	}
	if len(h.f.strs.m) != 0 {
		t.Fatalf("interned strings left after every grant ended: %v", h.f.strs.m)
	}
}
