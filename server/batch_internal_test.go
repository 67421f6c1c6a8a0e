package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// applyEntry applies data as the entry at idx and returns its result.
func applyEntry(f *fsm, idx uint64, data []byte) interface{} {
	return f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: data})
}

// TestFSM_BatchEntryDecodes: a batch of one is the plain entry byte for
// byte; a batch of several decodes to its commands in order.
func TestFSM_BatchEntryDecodes(t *testing.T) {
	a := &command{op: opAcquire, key: "k", owner: "o", ttl: time.Second, wait: true, maxLeases: 9}
	r := &command{op: opRelease, key: "k", owner: "o"}
	if got, want := encodeBatch([]*command{a}), a.encode(); !bytes.Equal(got, want) {
		t.Fatalf("a batch of one = %x, want the plain entry %x", got, want)
	}
	cs, err := decodeBatch(encodeBatch([]*command{a, r, a}))
	if err != nil {
		t.Fatal(err)
	}
	if want := []command{*a, *r, *a}; !reflect.DeepEqual(cs, want) {
		t.Fatalf("decoded %+v, want %+v", cs, want)
	}
}

// TestFSM_MalformedBatchIsCorrupt: a batch entry that does not decode
// whole is errCorrupt (never a panic), its entry's result is a bad
// command, and it changes nothing, not even the commands before the bad
// one.
func TestFSM_MalformedBatchIsCorrupt(t *testing.T) {
	good := encodeBatch([]*command{
		{op: opAcquire, key: "k", owner: "o", ttl: time.Second, maxLeases: 9},
		{op: opAcquire, key: "j", owner: "o", ttl: time.Second, maxLeases: 9},
	})
	nested := encodeBatch([]*command{{op: opNoop}, {op: opNoop}})
	sub := (&command{op: opAcquire, key: "k", owner: "o", ttl: time.Second, maxLeases: 9}).encode()
	cases := map[string][]byte{
		"header only":    {batchVersion},
		"not a batch op": {batchVersion, byte(opAcquire), 1, 2, 3},
		"no count":       {batchVersion, byte(opBatch)},
		"zero commands":  {batchVersion, byte(opBatch), 0},
		"count too big":  append([]byte{batchVersion, byte(opBatch), 0xff, 0xff, 0xff, 0xff, 0x0f}, sub...),
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(append([]byte(nil), good...), 0),
		"length too big": {batchVersion, byte(opBatch), 2, 0x7f, 1, 2},
		"bad command":    append([]byte{batchVersion, byte(opBatch), 2, byte(len(sub))}, append(append([]byte(nil), sub...), 2, 9, 0)...),
		"nested batch":   append(append([]byte{batchVersion, byte(opBatch), 2, byte(len(sub))}, sub...), append([]byte{byte(len(nested))}, nested...)...),
		"count short":    append(append([]byte{batchVersion, byte(opBatch), 3, byte(len(sub))}, sub...), append([]byte{byte(len(sub))}, sub...)...),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeBatch(b); !errors.Is(err, errCorrupt) {
				t.Fatalf("decodeBatch(%x) = %v, want errCorrupt", b, err)
			}
			f := newFSM(nil)
			before := dump(f)
			if r, ok := applyEntry(f, 1, b).(applyResult); !ok || r.code != resBadCommand {
				t.Fatalf("Apply = %+v, want a bad command", r)
			}
			if after := dump(f); after != before {
				t.Fatalf("a corrupt batch changed the table:\n%s", after)
			}
		})
	}
}

// FuzzDecodeBatch: decodeBatch never panics, and a batch it accepts
// encodes back to one that decodes to the same commands.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(encodeBatch([]*command{{op: opAcquire, key: "k", owner: "o", ttl: time.Second, wait: true}, {op: opRelease, key: "k", owner: "o"}}))
	f.Add(encodeBatch([]*command{{op: opExpire, expiries: []expiry{{"a", "b", 7}}}, {op: opNoop}, {op: opEndDelay, key: "k", version: 9}}))
	f.Add(encodeBatch([]*command{{op: opPurgeIdle, idle: []idleEntry{{"k", "o", 7}}}, {op: opAcquire, key: "k", owner: "o", shared: true, limit: 2}}))
	f.Add([]byte{batchVersion, byte(opBatch), 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := decodeBatch(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("decodeBatch error %v is not errCorrupt", err)
			}
			return
		}
		ps := make([]*command, len(cs))
		for i := range cs {
			ps[i] = &cs[i]
		}
		var again []command
		if len(ps) == 1 {
			c, err := decodeCommand(encodeBatch(ps))
			if err != nil {
				t.Fatal(err)
			}
			again = []command{c}
		} else if again, err = decodeBatch(encodeBatch(ps)); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cs, again) {
			t.Fatalf("re-encoding changed the batch: %+v vs %+v", cs, again)
		}
		// Applying it never panics and keeps the table consistent.
		fm := newFSM(nil)
		applyEntry(fm, 1, b)
		if err := fm.check(); err != nil {
			t.Fatal(err)
		}
	})
}

// batchHarness applies commands to two tables: one entry per command
// (seq), and the same commands grouped into batch entries (bat).
type batchHarness struct {
	t          *testing.T
	seq, bat   *fsm
	seqI, batI uint64
	recS, recB *recorder
	lastFence  map[string]uint64 // bat: the last fence per key
	fences     map[uint64]bool   // bat: every fence issued
}

func newBatchHarness(t *testing.T) *batchHarness {
	h := &batchHarness{t: t, recS: &recorder{}, recB: &recorder{}, lastFence: map[string]uint64{}, fences: map[uint64]bool{}}
	h.seq, h.bat = newFSM(h.recS), newFSM(h.recB)
	return h
}

// entry applies cs as one batch entry to bat and one by one to seq, and
// checks that every command got the same result code from both, that bat
// stays consistent and that its fences are unique and strictly
// increasing per key.
func (h *batchHarness) entry(cs ...command) []applyResult {
	h.t.Helper()
	ps := make([]*command, len(cs))
	var want []applyResult
	for i := range cs {
		ps[i] = &cs[i]
		h.seqI++
		want = append(want, applyEntry(h.seq, h.seqI, cs[i].encode()).(applyResult))
	}
	h.batI++
	h.recB.evs = h.recB.evs[:0]
	var got []applyResult
	switch r := applyEntry(h.bat, h.batI, encodeBatch(ps)).(type) {
	case applyResult:
		got = []applyResult{r}
	case batchResult:
		got = r
	}
	if len(got) != len(cs) {
		h.t.Fatalf("%d results for %d commands", len(got), len(cs))
	}
	for i := range cs {
		if got[i].code != want[i].code || got[i].position != want[i].position || got[i].dequeued != want[i].dequeued || got[i].released != want[i].released {
			h.t.Fatalf("command %d %+v: batched %+v, one per entry %+v", i, cs[i], got[i], want[i])
		}
		if got[i].code == resBadCommand {
			h.t.Fatalf("command %d %+v did not apply", i, cs[i])
		}
	}
	if err := h.bat.check(); err != nil {
		h.t.Fatalf("after %+v: %v", cs, err)
	}
	for _, ev := range h.recB.evs {
		if ev.kind != evGranted {
			continue
		}
		if ev.fence <= h.lastFence[ev.key] || h.fences[ev.fence] {
			h.t.Fatalf("key %s: fence %d after %d (or issued before)", ev.key, ev.fence, h.lastFence[ev.key])
		}
		h.lastFence[ev.key] = ev.fence
		h.fences[ev.fence] = true
	}
	if a, b := holders(h.seq), holders(h.bat); a != b {
		h.t.Fatalf("batched table differs from the one of one entry per command:\n%s\n%s", b, a)
	}
	return got
}

// holders renders who holds and who waits for each key (no fences nor
// versions: those depend on the indexes).
func holders(f *fsm) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var b bytes.Buffer
	for _, k := range []string{"k", "j"} {
		e := f.locks.get(k)
		if e == nil {
			fmt.Fprintf(&b, "%s: -\n", k)
			continue
		}
		fmt.Fprintf(&b, "%s: held=%v by %q ttl=%v delay=%v shared=%d:", k, e.held, e.grant.owner, e.grant.ttl, e.delay, len(e.shared))
		e.q.each(func(w *waiter) { fmt.Fprintf(&b, " %s", w.owner) })
		b.WriteString("\n")
	}
	return b.String()
}

// version returns the version of owner's grant on key in f (0: none).
func grantVersion(f *fsm, key, owner string) uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if e := f.locks.get(key); e != nil && e.held && e.grant.owner == owner {
		return e.grant.version
	}
	return 0
}

func acquireCmd(key, owner string, wait bool) command {
	return command{op: opAcquire, key: key, owner: owner, ttl: time.Second, wait: wait, maxWaiters: 10, maxLeases: 10, lockDelay: 0}
}

// TestFSM_BatchSameKeyTwice: commands of one entry on the same key share
// its index and still behave as if each had its own entry: a grant,
// release and grant again; a handoff through several waiters; expiry
// and renewal in both orders; a lock-delay started and a purge of a
// re-attached waiter. Fences stay unique and strictly increasing per key.
func TestFSM_BatchSameKeyTwice(t *testing.T) {
	h := newBatchHarness(t)
	// acquire + release + acquire (another owner) + acquire (queued) +
	// release: the queued one is handed the key in the same entry.
	rs := h.entry(acquireCmd("k", "a", false), command{op: opRelease, key: "k", owner: "a"}, acquireCmd("k", "b", false), acquireCmd("k", "c", true), command{op: opRelease, key: "k", owner: "b"})
	if rs[0].fence == 0 || rs[2].fence <= rs[0].fence || rs[4].fence <= rs[2].fence {
		t.Fatalf("fences %d, %d, then %d handed over: not increasing", rs[0].fence, rs[2].fence, rs[4].fence)
	}
	// Expiry then renewal through the log in one entry: the expiry (for
	// the version the leader saw) ends the grant, the renewal finds none.
	v := grantVersion(h.bat, "k", "c")
	if vs := grantVersion(h.seq, "k", "c"); v == 0 || vs == 0 {
		t.Fatal("c does not hold k")
	}
	h.entry(acquireCmd("j", "x", false))
	vx, vxs := grantVersion(h.bat, "j", "x"), grantVersion(h.seq, "j", "x")
	// Renewal then expiry: the renewal makes the expiry stale. Both tables
	// get the expiry for their own version (their indexes differ).
	ps := []*command{{op: opSetTTL, key: "j", owner: "x", ttl: 2 * time.Second}, {op: opExpire, expiries: []expiry{{"j", "x", vx}}}}
	h.batI++
	r := applyEntry(h.bat, h.batI, encodeBatch(ps)).(batchResult)
	h.seqI++
	applyEntry(h.seq, h.seqI, ps[0].encode())
	h.seqI++
	applyEntry(h.seq, h.seqI, (&command{op: opExpire, expiries: []expiry{{"j", "x", vxs}}}).encode())
	if r[0].code != resOK || grantVersion(h.bat, "j", "x") != h.batI {
		t.Fatalf("renewal then a stale expiry: %+v, version %d", r, grantVersion(h.bat, "j", "x"))
	}
	if a, b := holders(h.seq), holders(h.bat); a != b {
		t.Fatalf("tables differ:\n%s\n%s", b, a)
	}
	// Expiry then renewal: the grant ends, the renewal is lost, and the
	// expiry hands the key to the waiter queued in the same entry before.
	vx = grantVersion(h.bat, "j", "x")
	vxs = grantVersion(h.seq, "j", "x")
	ps = []*command{ptr(acquireCmd("j", "y", true)), {op: opExpire, expiries: []expiry{{"j", "x", vx}}}, {op: opSetTTL, key: "j", owner: "x", ttl: 2 * time.Second}}
	h.batI++
	r = applyEntry(h.bat, h.batI, encodeBatch(ps)).(batchResult)
	for _, c := range []*command{ps[0], {op: opExpire, expiries: []expiry{{"j", "x", vxs}}}, ps[2]} {
		h.seqI++
		applyEntry(h.seq, h.seqI, c.encode())
	}
	if r[0].code != resQueued || r[2].code != resLost {
		t.Fatalf("queue, expiry, renewal = %+v", r)
	}
	if a, b := holders(h.seq), holders(h.bat); a != b || grantVersion(h.bat, "j", "y") != h.batI {
		t.Fatalf("tables differ (or y's version %d is not the entry's %d):\n%s\n%s", grantVersion(h.bat, "j", "y"), h.batI, b, a)
	}
	// A grant and its TTL change in one entry share the version: an
	// expiry proposed later for it (the version the leader saw) ends it.
	rs = h.entry(acquireCmd("k", "d", true), command{op: opRelease, key: "k", owner: "c"}, command{op: opSetTTL, key: "k", owner: "d", ttl: 3 * time.Second})
	if rs[2].code != resOK {
		t.Fatalf("TTL change of a grant made in the same entry: %+v", rs[2])
	}
	vd := grantVersion(h.bat, "k", "d")
	h.batI++
	applyEntry(h.bat, h.batI, (&command{op: opExpire, expiries: []expiry{{"k", "d", vd}}}).encode())
	if grantVersion(h.bat, "k", "d") != 0 {
		t.Fatal("an expiry for the version of a grant renewed in its own entry did not end it")
	}
	h.seqI++
	applyEntry(h.seq, h.seqI, (&command{op: opForceRelease, key: "k"}).encode())
	// A lock-delay started by a force release, the key re-acquired in the
	// same entry is refused (delayed), and an end of the delay proposed
	// for its version hands it on.
	h.entry(acquireCmd("k", "e", false))
	delayed := acquireCmd("k", "e", false)
	delayed.lockDelay = time.Second
	h.entry(command{op: opRelease, key: "k", owner: "e"}, delayed)
	rs = h.entry(command{op: opForceRelease, key: "k"}, acquireCmd("k", "f", false), acquireCmd("k", "g", true))
	if rs[1].code != resDelayed || rs[2].code != resQueued {
		t.Fatalf("acquisitions in the lock-delay of the same entry: %+v", rs)
	}
	h.bat.mu.RLock()
	dv := h.bat.locks.get("k").delayVersion
	h.bat.mu.RUnlock()
	h.seq.mu.RLock()
	dvs := h.seq.locks.get("k").delayVersion
	h.seq.mu.RUnlock()
	if dv != h.batI {
		t.Fatalf("delay version %d, want the entry's %d", dv, h.batI)
	}
	// A re-attachment and a purge naming the entry's since (the grace
	// that ran out) in one entry: the re-attachment comes first, so the
	// purge misses. Then the end of the delay grants g.
	var since, sinceS uint64
	for _, p := range h.bat.queued() {
		if p.ko.owner == "g" {
			since = p.since
		}
	}
	for _, p := range h.seq.queued() {
		if p.ko.owner == "g" {
			sinceS = p.since
		}
	}
	ps = []*command{ptr(acquireCmd("k", "g", true)), {op: opPurgeIdle, idle: []idleEntry{{"k", "g", since}}}, {op: opEndDelay, key: "k", version: dv}}
	h.batI++
	r = applyEntry(h.bat, h.batI, encodeBatch(ps)).(batchResult)
	for _, c := range []*command{ps[0], {op: opPurgeIdle, idle: []idleEntry{{"k", "g", sinceS}}}, {op: opEndDelay, key: "k", version: dvs}} {
		h.seqI++
		applyEntry(h.seq, h.seqI, c.encode())
	}
	if r[0].code != resQueued || r[2].fence == 0 || grantVersion(h.bat, "k", "g") != h.batI {
		t.Fatalf("re-attach, purge, end of delay = %+v; g's version %d", r, grantVersion(h.bat, "k", "g"))
	}
	if a, b := holders(h.seq), holders(h.bat); a != b {
		t.Fatalf("tables differ:\n%s\n%s", b, a)
	}
	// Fences across a snapshot and its restore: the next grant's fence is
	// above every fence issued, also when the entry index is behind them
	// (an entry of three grants took three fences).
	h.entry(acquireCmd("j", "m", false), acquireCmd("j2", "m", false), acquireCmd("j3", "m", false))
	restored := snapshotRestored(t, h.bat)
	var top uint64
	for fence := range h.fences {
		top = max(top, fence)
	}
	if top <= h.batI {
		t.Fatalf("the test wants fences ahead of the index: top fence %d, index %d", top, h.batI)
	}
	r = applyEntry(restored, h.batI+1, encodeBatch([]*command{ptr(acquireCmd("n", "a", false)), ptr(acquireCmd("n2", "a", false))})).(batchResult)
	if r[0].fence <= top || r[1].fence <= r[0].fence {
		t.Fatalf("fences after restore %d, %d; issued before up to %d", r[0].fence, r[1].fence, top)
	}
}

func ptr(c command) *command { return &c }

// FuzzFSMApplyBatch applies random commands grouped into random batch
// entries, beside the same commands one per entry: every command gets the
// same result either way, the batched table stays consistent and equal in
// holders and queues, and its fences are unique and strictly increasing
// per key, also after a snapshot and its restore.
func FuzzFSMApplyBatch(f *testing.F) {
	f.Add([]byte{0, 0x01, 1, 0x02, 2, 0x01, 0x80, 0x11, 3, 0x12, 4, 0x01, 0x81, 0x02})
	f.Add(bytes.Repeat([]byte{1, 0x01, 1, 0x02, 2, 0x01, 1, 0x03, 0x82, 0x02, 5, 0x03, 3, 0x03}, 6))
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newBatchHarness(t)
		owners := []string{"o0", "o1", "o2", "o3"}
		keys := []string{"k", "j"}
		var pending []command
		for i := 0; i+1 < len(data) && i < 400; i += 2 {
			b, arg := data[i], data[i+1]
			key, owner := keys[int(arg>>4)%len(keys)], owners[int(arg)%len(owners)]
			var c command
			switch b % 7 {
			case 0, 1:
				c = acquireCmd(key, owner, b%2 == 1)
				if arg&8 != 0 {
					c.lockDelay = time.Second
				}
			case 2:
				c = command{op: opRelease, key: key, owner: owner}
			case 3:
				c = command{op: opCancelWait, key: key, owner: owner}
			case 4:
				c = command{op: opSetTTL, key: key, owner: owner, ttl: 2 * time.Second}
			case 5:
				c = command{op: opForceRelease, key: key}
			case 6:
				c = command{op: opNoop}
			}
			pending = append(pending, c)
			if b&0x80 != 0 || len(pending) == 8 { // the end of an entry
				h.entry(pending...)
				pending = pending[:0]
			}
		}
		if len(pending) > 0 {
			h.entry(pending...)
		}
		restored := snapshotRestored(t, h.bat)
		var top uint64
		for fence := range h.fences {
			top = max(top, fence)
		}
		r := applyEntry(restored, h.batI+1, ptr(acquireCmd("fresh", "a", false)).encode()).(applyResult)
		if r.fence <= top {
			t.Fatalf("fence %d after restore; issued before up to %d", r.fence, top)
		}
	})
}

// TestServer_ProposalsAreBatched: many concurrent proposals are written
// in fewer entries than commands, each caller gets its own result, and a
// lone proposal on an idle server is written at once as a plain entry.
func TestServer_ProposalsAreBatched(t *testing.T) {
	s := startNode(t)
	ctx := t.Context()
	s.proposer.mu.Lock()
	e0, c0 := s.proposer.entries, s.proposer.commands
	s.proposer.mu.Unlock()
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	fences := make(chan uint64, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.acquire(ctx, acquireIn{key: fmt.Sprint("batch-", i%50), owner: fmt.Sprintf("owner-%04d-xxxx", i), ttl: time.Minute, wait: true}, nil, nil)
			if err != nil {
				errs <- err
				return
			}
			fences <- out.fence
			if _, err := s.release(out.key, out.owner); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(fences)
	for err := range errs {
		t.Error(err)
	}
	seen := map[uint64]bool{}
	for f := range fences {
		if f == 0 || seen[f] {
			t.Fatalf("fence %d issued twice (or zero)", f)
		}
		seen[f] = true
	}
	s.proposer.mu.Lock()
	entries, commands := s.proposer.entries-e0, s.proposer.commands-c0
	s.proposer.mu.Unlock()
	if commands < n || entries >= commands {
		t.Fatalf("%d commands in %d entries: not batched", commands, entries)
	}
	t.Logf("%d commands in %d entries", commands, entries)

	// Idle: one proposal goes alone, at once, as the plain entry.
	before := s.raft.LastIndex()
	c := &command{op: opAcquire, key: "alone", owner: "owner-alone-0000", ttl: time.Minute, maxLeases: 1000, maxWaiters: 10}
	if _, err := s.propose(c); err != nil {
		t.Fatal(err)
	}
	last := s.raft.LastIndex()
	if last != before+1 {
		t.Fatalf("a lone proposal wrote entries %d..%d", before+1, last)
	}
	l := new(raft.Log)
	if err := s.wal.GetLog(last, l); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Data, c.encode()) {
		t.Fatalf("a lone proposal's entry is %x, want the plain command %x", l.Data, c.encode())
	}
	s.proposer.mu.Lock()
	busy, queued := s.proposer.busy, len(s.proposer.queue)
	s.proposer.mu.Unlock()
	if busy || queued != 0 {
		t.Fatalf("idle proposer busy=%v with %d queued", busy, queued)
	}
}

// TestServer_BatchingOffWritesOneEntryPerCommand: with Batching off
// (the first step of a downgrade; in any case) even a single server writes
// one entry per command, and still gives every caller its own result.
func TestServer_BatchingOffWritesOneEntryPerCommand(t *testing.T) {
	cfg := testConfig(t)
	cfg.Batching = " OFF" // any case, as the flag takes it
	s := startTestServer(t, cfg)
	if s.batchMode() != BatchNever {
		t.Fatalf("mode %q, want %q", s.batchMode(), BatchNever)
	}
	entries, commands := entriesOf(s, func() { burstOn(t, s, 200) })
	if commands < 200 || entries != commands {
		t.Fatalf("%d commands in %d entries with Batching off, want one entry each", commands, entries)
	}
}

// TestServer_FencesAfterRestartWithBatches: a log and a snapshot holding
// batch entries replay to the same table on restart, and every fence
// issued after the restart is above every fence issued before.
func TestServer_FencesAfterRestartWithBatches(t *testing.T) {
	cfg := testConfig(t)
	ctx := t.Context()
	start := func() *Server {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var top uint64
	burst := func(s *Server, round int) {
		t.Helper()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := s.acquire(ctx, acquireIn{key: fmt.Sprintf("r%d-%d", round, i%20), owner: fmt.Sprintf("owner-%d-%04d-x", round, i), ttl: time.Minute}, nil, nil)
				if err != nil {
					return // a try of a key held by another owner
				}
				mu.Lock()
				if out.fence <= top && round > 0 {
					t.Errorf("round %d: fence %d after restart, not above %d", round, out.fence, top)
				}
				mu.Unlock()
				if i%3 != 0 { // keep some held across the restart
					_, _ = s.release(out.key, out.owner)
				}
			}()
		}
		wg.Wait()
	}
	s := start()
	burst(s, 0)
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	burst(s, 1) // batch entries after the snapshot, replayed from the log
	s.proposer.mu.Lock()
	entries, commands := s.proposer.entries, s.proposer.commands
	s.proposer.mu.Unlock()
	if entries >= commands {
		t.Fatalf("%d commands in %d entries: the log holds no batch", commands, entries)
	}
	before := dump(s.fsm)
	s.fsm.mu.RLock()
	top = s.fsm.lastFence
	s.fsm.mu.RUnlock()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = start()
	defer s.Close()
	if after := dump(s.fsm); after != before {
		t.Fatalf("the table after a restart differs:\n%s\nbefore:\n%s", after, before)
	}
	burst(s, 2)
	out, err := s.acquire(ctx, acquireIn{key: "after", owner: "owner-after-00", ttl: time.Minute}, nil, nil)
	if err != nil || out.fence <= top {
		t.Fatalf("fence %d after restart (%v), not above %d", out.fence, err, top)
	}
}

// entriesOf runs run and returns the log entries s's proposer wrote
// meanwhile and the commands they held.
func entriesOf(s *Server, run func()) (entries, commands uint64) {
	s.proposer.mu.Lock()
	e0, c0 := s.proposer.entries, s.proposer.commands
	s.proposer.mu.Unlock()
	run()
	s.proposer.mu.Lock()
	defer s.proposer.mu.Unlock()
	return s.proposer.entries - e0, s.proposer.commands - c0
}

// burstOn runs n concurrent acquisitions with wait on 10 keys, each
// released once granted, against s.
func burstOn(t *testing.T, s *Server, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.acquire(t.Context(), acquireIn{key: fmt.Sprint("burst-", i%10), owner: fmt.Sprintf("owner-%04d-xxxx", i), ttl: time.Minute, wait: true}, nil, nil)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.release(out.key, out.owner); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// TestCluster_BatchEntriesGated: in a cluster the leader checks leadership
// with a quorum round, not as a sole voter, and writes batch entries only
// while every member reports that it decodes them (the batch gate): with
// every member of this version it batches once its probe has their
// answers, and every member applies the batches to the same table; with
// one member standing in for a version before batching it writes one entry
// per command, for as long as that member is in the configuration, and
// logs which member keeps it off; with Batching on it batches whatever the
// members say, with Batching off never.
func TestCluster_BatchEntriesGated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		legacy bool      // n3 stands in for a member of a version before batching
		mode   BatchMode // Config.Batching
		batch  bool
	}{
		{"every member decodes batches", false, "", true},
		{"one member of an earlier version", true, "", false},
		{"one member of an earlier version, batching on", true, BatchAlways, true},
		{"every member decodes batches, batching off", false, BatchNever, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := map[string]*logBuffer{}
			c := startLeaseCluster(t, 3, func(cfg *Config) {
				cfg.Batching = tc.mode
				cfg.legacyNoBatch = tc.legacy && cfg.NodeID == "n3"
				logs[cfg.NodeID] = &logBuffer{}
				cfg.Logger = slog.New(slog.NewTextHandler(logs[cfg.NodeID], &slog.HandlerOptions{Level: slog.LevelInfo}))
			})
			var s *Server
			for {
				// A leader of the earlier version never batches: have one
				// of this version lead.
				if s = c.leader(20 * time.Second); s.cfg.NodeID != "n3" || !tc.legacy {
					break
				}
				if err := s.raft.LeadershipTransfer().Error(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			for _, n := range c.nodes {
				if n.soleVoter() {
					t.Fatalf("%s is a sole voter in a cluster of 3", n.cfg.NodeID)
				}
			}
			// Both members register and the leader probes them within a
			// few seconds; until then it does not batch.
			deadline := time.Now().Add(5 * time.Second)
			for tc.batch && !s.batchEntries() {
				if time.Now().After(deadline) {
					t.Fatalf("the leader does not batch 5 s after its election (probe %+v)", s.batchProbe.Load())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !tc.batch {
				// Probes keep saying no: watch three of them.
				for end := time.Now().Add(3500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if s.batchEntries() {
						t.Fatal("the leader batches with a member that does not decode batch entries")
					}
				}
				if p := s.batchProbe.Load(); p == nil || time.Since(p.at) > 2*time.Second || p.all != !tc.legacy {
					t.Fatalf("the probe %+v: want a recent one that found every member decoding batches: %v", p, !tc.legacy)
				}
			}
			// The leader says why it does not batch, naming the member
			// and the reason (a member not registered yet may come
			// first), and when it does; with a mode set it logs no
			// verdict.
			leaderLog := logs[s.cfg.NodeID].String()
			off := strings.LastIndex(leaderLog, "batching off")
			on := strings.LastIndex(leaderLog, "batching on")
			switch {
			case tc.mode != "":
				if off >= 0 || on >= 0 {
					t.Errorf("with Batching %q the leader logged a verdict:\n%s", tc.mode, leaderLog)
				}
			case tc.legacy:
				if on >= 0 || off < 0 || !strings.Contains(leaderLog[off:], "n3: it does not report batch_entries") {
					t.Errorf("the leader's log: want batching off naming n3 and why, and never on; got:\n%s", leaderLog)
				}
			default:
				if on < 0 || off > on {
					t.Errorf("the leader's log: want batching on last; got:\n%s", leaderLog)
				}
			}
			for _, n := range c.nodes { // registered, so that Status asks each
				for rec, ok := s.fsm.member(n.cfg.NodeID); !ok || rec.api == ""; rec, ok = s.fsm.member(n.cfg.NodeID) {
					if time.Now().After(deadline.Add(5 * time.Second)) {
						t.Fatalf("%s not registered", n.cfg.NodeID)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			st, err := s.clusterStatus(t.Context(), false)
			if err != nil {
				t.Fatal(err)
			}
			if st.GetBatching() != tc.batch {
				t.Errorf("Status batching = %v, want %v", st.GetBatching(), tc.batch)
			}
			for _, m := range st.GetMembers() {
				if want := !(tc.legacy && m.GetId() == "n3"); m.GetBatchEntries() != want {
					t.Errorf("Status: member %s batch_entries = %v, want %v (%+v)", m.GetId(), m.GetBatchEntries(), want, m)
				}
			}
			entries, commands := entriesOf(s, func() { burstOn(t, s, 200) })
			if !tc.batch && entries != commands {
				t.Fatalf("%d commands in %d entries: batched with a member that cannot decode batch entries", commands, entries)
			}
			if tc.batch && entries >= commands {
				t.Fatalf("%d commands in %d entries: not batched", commands, entries)
			}
			if err := s.raft.Barrier(10 * time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			want := dump(s.fsm)
			deadline = time.Now().Add(10 * time.Second)
			for _, n := range c.nodes {
				for dump(n.fsm) != want {
					if time.Now().After(deadline) {
						t.Fatalf("%s's table differs from the leader's:\n%s\nleader:\n%s", n.cfg.NodeID, dump(n.fsm), want)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}

// TestServer_QueueEntryRidesWithRelease: a wait for a held key does not
// start an entry alone: the holder's release, proposed meanwhile, takes
// it along (one entry, one fsync, for both), and the waiter is granted by
// that entry. Alone, it is still written (after at most maxQueueDefer).
func TestServer_QueueEntryRidesWithRelease(t *testing.T) {
	s := startNode(t)
	ctx := t.Context()
	a, err := s.acquire(ctx, acquireIn{key: "k", owner: "owner-a-000000", ttl: time.Minute}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.proposer.mu.Lock()
	s.proposer.queueDefer = time.Hour // b waits for the release
	s.proposer.mu.Unlock()
	before := s.raft.LastIndex()
	got := goAcquire(ctx, s, acquireIn{key: "k", owner: "owner-b-000000", ttl: time.Minute, wait: true}, nil)
	awaitQueued(t, s, 1, "b's proposal deferred")
	s.proposer.mu.Lock()
	s.proposer.queueDefer = 0
	s.proposer.mu.Unlock()
	next, err := s.release("k", a.owner)
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.out.fence != next || next == 0 {
		t.Fatalf("b: %+v %v; release handed fence %d", r.out, r.err, next)
	}
	if after := s.raft.LastIndex(); after != before+1 {
		t.Fatalf("the queue entry and the release took entries %d..%d, want one", before+1, after)
	}
	// Alone: c queues behind b, with nothing else proposed.
	queued := make(chan int, 1)
	cGot := goAcquire(ctx, s, acquireIn{key: "k", owner: "owner-c-000000", ttl: time.Minute, wait: true}, func(pos int) { queued <- pos })
	select {
	case pos := <-queued:
		if pos != 1 {
			t.Fatalf("c queued at %d, want 1", pos)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone queue entry was never written")
	}
	next, err = s.release("k", "owner-b-000000")
	if err != nil {
		t.Fatal(err)
	}
	// c is granted by b's release; the test ends only once its wait has.
	if r := <-cGot; r.err != nil || r.out.fence != next || next == 0 {
		t.Fatalf("c: %+v %v; release handed fence %d", r.out, r.err, next)
	}
}

// TestBatchGate_MembersDecodeBatches: the gate's decision on a probe: every
// other member answered, and the probe is fresh and of the same term and
// configuration; no probe, a member that did not answer, an old probe, a
// probe of an earlier term (leadership lost and won back) or of another
// configuration (a member added, or removed and added again), or a leader
// standing in for an earlier version each turn batching off.
func TestBatchGate_MembersDecodeBatches(t *testing.T) {
	probe := func(age time.Duration, all bool) *batchProbe {
		return &batchProbe{at: time.Now().Add(-age), term: 7, confIndex: 40, all: all}
	}
	for _, tc := range []struct {
		name            string
		probe           *batchProbe
		term, confIndex uint64
		legacy          bool
		want            bool
	}{
		{"every member answered", probe(0, true), 7, 40, false, true},
		{"no probe yet", nil, 7, 40, false, false},
		{"a member that did not answer", probe(0, false), 7, 40, false, false},
		{"a probe too old", probe(batchProbeFresh+time.Second, true), 7, 40, false, false},
		{"a probe of an earlier term", probe(0, true), 8, 40, false, false},
		{"a probe of another configuration", probe(0, true), 7, 41, false, false},
		{"a leader of an earlier version", probe(0, true), 7, 40, true, false},
	} {
		s := &Server{cfg: Config{NodeID: "n1", legacyNoBatch: tc.legacy}}
		s.batchProbe.Store(tc.probe)
		if got := s.membersDecodeBatches(tc.term, tc.confIndex); got != tc.want {
			t.Errorf("%s: membersDecodeBatches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServer_QueueEntryDuringARoundWaitsForTheNextRelease: a wait for a
// held key proposed while a round is in flight (a release's, in a handoff
// loop) is not sent alone when that round ends, as a round (and an fsync)
// of its own that the next release would wait behind: it waits for the
// next proposal to take it along, or for its timer. And when its timer
// fires while a round is in flight, that round's end sends it at once.
func TestServer_QueueEntryDuringARoundWaitsForTheNextRelease(t *testing.T) {
	s := startNode(t)
	ctx := t.Context()
	a, err := s.acquire(ctx, acquireIn{key: "k", owner: "owner-a-000000", ttl: time.Minute}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &s.proposer
	// A round is in flight (as if a release were being written).
	b.mu.Lock()
	b.busy = true
	b.queueDefer = time.Hour
	b.mu.Unlock()
	before := s.raft.LastIndex()
	got := goAcquire(ctx, s, acquireIn{key: "k", owner: "owner-b-000000", ttl: time.Minute, wait: true}, nil)
	awaitQueued(t, s, 1, "b's proposal queued")
	// The round ends: b's lone deferred proposal stays queued, its timer set.
	if next := s.nextRound(); next != nil {
		t.Fatalf("the round's end sent %d deferred proposals alone", len(next))
	}
	b.mu.Lock()
	busy, queued, armed := b.busy, len(b.queue), b.deferArmed
	b.queueDefer = 0
	b.mu.Unlock()
	if busy || queued != 1 || !armed {
		t.Fatalf("after the round: busy=%v, %d queued, timer armed=%v; want idle, 1, armed", busy, queued, armed)
	}
	next, err := s.release("k", a.owner)
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.out.fence != next || next == 0 {
		t.Fatalf("b: %+v %v; release handed fence %d", r.out, r.err, next)
	}
	if after := s.raft.LastIndex(); after != before+1 {
		t.Fatalf("the queue entry and the release took entries %d..%d, want one", before+1, after)
	}

	// The timer fires while a round is in flight: that round's end sends it.
	b.mu.Lock()
	b.busy = true
	b.queueDefer = time.Millisecond
	b.mu.Unlock()
	cGot := goAcquire(ctx, s, acquireIn{key: "k", owner: "owner-c-000000", ttl: time.Minute, wait: true}, nil)
	awaitQueued(t, s, 1, "c's proposal queued")
	b.mu.Lock()
	armed = b.deferArmed
	b.mu.Unlock()
	if armed {
		t.Fatal("a deferred proposal queued during a round set its timer")
	}
	// Its timer: armed only once no round is in flight; simulate the firing
	// during a round, as sendDeferred sees it.
	s.sendDeferred()
	b.mu.Lock()
	due := b.deferDue
	b.mu.Unlock()
	if !due {
		t.Fatal("a timer that fired during a round did not mark the queue due")
	}
	round := s.nextRound()
	if len(round) != 1 {
		t.Fatalf("the round's end took %d proposals, want c's", len(round))
	}
	s.sendRounds(round) // what the round's goroutine does next
	b.mu.Lock()
	busy, b.queueDefer = b.busy, 0
	b.mu.Unlock()
	if busy {
		t.Fatal("the proposer stayed busy with nothing queued")
	}
	next, err = s.release("k", "owner-b-000000")
	if err != nil {
		t.Fatal(err)
	}
	if r := <-cGot; r.err != nil || r.out.fence != next || next == 0 {
		t.Fatalf("c: %+v %v; release handed fence %d", r.out, r.err, next)
	}
}

// acquireResult is what an acquisition run by goAcquire returned.
type acquireResult struct {
	out acquireOut
	err error
}

// goAcquire runs s.acquire(ctx, in) on a goroutine; its result arrives on
// the channel.
func goAcquire(ctx context.Context, s *Server, in acquireIn, onQueued func(int)) <-chan acquireResult {
	got := make(chan acquireResult, 1)
	go func() {
		out, err := s.acquire(ctx, in, nil, onQueued)
		got <- acquireResult{out, err}
	}()
	return got
}

// awaitQueued waits until s's proposer holds n queued proposals.
func awaitQueued(t *testing.T, s *Server, n int, what string) {
	t.Helper()
	pollUntil(t, 10*time.Second, what, func() bool {
		s.proposer.mu.Lock()
		defer s.proposer.mu.Unlock()
		return len(s.proposer.queue) == n
	})
}
