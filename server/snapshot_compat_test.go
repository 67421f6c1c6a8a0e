package server

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"
)

// snapshotScenario fills h's table with every kind of entry a snapshot
// holds: plain grants (one logged suspect, one with a lock-delay), a queue
// of waiters, a key in its lock-delay, and with shared, Shared grants of a
// limited key with a Shared waiter and a lost Shared grant in its
// lock-delay (which makes the snapshot v4; without, it is written in v3).
func snapshotScenario(h *fsmHarness, shared bool) {
	h.t.Helper()
	acq := func(key, owner string, wait bool, delay time.Duration) {
		h.t.Helper()
		r := h.apply(command{op: opAcquire, key: key, owner: owner, holder: "host-" + owner, session: "sess-" + owner[:1], ttl: 7 * time.Second, lockDelay: delay, wait: wait, maxWaiters: 10, maxLeases: 100})
		if r.code != resGranted && r.code != resQueued {
			h.t.Fatalf("acquire %s %s = %+v", key, owner, r)
		}
	}
	acq("plain", "a1", false, 0)
	acq("suspect", "b1", false, 0)
	h.apply(command{op: opSuspect, suspects: []suspectMark{{key: "suspect", owner: "b1", version: h.idx, left: 3 * time.Second}}})
	acq("delayed", "c1", false, 2*time.Second)
	h.apply(command{op: opExpire, expiries: []expiry{{key: "delayed", owner: "c1", version: h.idx}}})
	acq("queue 🔒", "d1", false, time.Second)
	acq("queue 🔒", "d2", true, 0)
	acq("queue 🔒", "e3", true, time.Second)
	if !shared {
		return
	}
	sh := func(key, owner string, wait bool, delay time.Duration) {
		h.t.Helper()
		r := h.apply(command{op: opAcquire, key: key, owner: owner, holder: "host-" + owner, session: "sess-" + owner[:1], ttl: 5 * time.Second, lockDelay: delay, wait: wait, maxWaiters: 10, maxLeases: 100, shared: true, limit: 2})
		if r.code != resGranted && r.code != resQueued {
			h.t.Fatalf("shared acquire %s %s = %+v", key, owner, r)
		}
	}
	sh("sem", "f1", false, time.Second)
	sh("sem", "f2", false, 0)
	h.apply(command{op: opExpire, expiries: []expiry{{key: "sem", owner: "f1", version: h.idx - 1}}})
	sh("sem", "g3", true, 0)
}

// TestFSM_SnapshotFormatUnchanged restores snapshots written by dlockd
// before Snapshot encoded the table itself (testdata/snapshot, made at
// commit 6d03234 from snapshotScenario: v3 without Shared grants, v4 with
// them), checks that they give the table the scenario builds now, and that
// today's snapshot of that table has the same size and restores the same.
func TestFSM_SnapshotFormatUnchanged(t *testing.T) {
	for _, c := range []struct {
		file, magic string
		shared      bool
	}{{"snapshot-v3.bin", snapshotMagicV3, false}, {"snapshot-v4.bin", snapshotMagic, true}} {
		t.Run(c.file, func(t *testing.T) {
			old, err := os.ReadFile("testdata/snapshot/" + c.file)
			if err != nil {
				t.Fatal(err)
			}
			h := newFSMHarness(t)
			snapshotScenario(h, c.shared)
			want := dump(h.f)
			restored := newFSM(&recorder{})
			if err := restored.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
				t.Fatal(err)
			}
			if got := dump(restored); got != want {
				t.Fatalf("old snapshot restores\n%s\nwant\n%s", got, want)
			}
			if err := restored.check(); err != nil {
				t.Fatal(err)
			}
			snap, err := h.f.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			defer snap.Release()
			sink := &memSink{}
			if err := snap.Persist(sink); err != nil {
				t.Fatal(err)
			}
			b := sink.Bytes()
			d := dec{b: b}
			if m := d.str(); m != c.magic || len(b) != len(old) {
				t.Fatalf("snapshot of %d bytes, magic %q; the old one: %d bytes, %q", len(b), m, len(old), c.magic)
			}
			again := newFSM(&recorder{})
			if err := again.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
				t.Fatal(err)
			}
			if got := dump(again); got != want {
				t.Fatalf("snapshot restores\n%s\nwant\n%s", got, want)
			}
		})
	}
}
