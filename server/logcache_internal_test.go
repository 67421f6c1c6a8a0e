package server

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// countingStore is a raft.LogStore that counts the reads that reach it.
type countingStore struct {
	*raft.InmemStore
	gets atomic.Int64
}

func (s *countingStore) GetLog(idx uint64, out *raft.Log) error {
	s.gets.Add(1)
	return s.InmemStore.GetLog(idx, out)
}

// copyingStore is a raft.InmemStore that keeps copies of the entries it
// stores, as a store on disk does (InmemStore keeps the pointers).
type copyingStore struct{ *raft.InmemStore }

func (s copyingStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s copyingStore) StoreLogs(logs []*raft.Log) error {
	copies := make([]*raft.Log, len(logs))
	for i, l := range logs {
		c := *l
		c.Data = bytes.Clone(l.Data)
		copies[i] = &c
	}
	return s.InmemStore.StoreLogs(copies)
}

func testLog(idx uint64, size int) *raft.Log {
	return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(idx)}, size)}
}

// check verifies the cache's invariants: the run fits the ring and the
// byte bound, bytes is the run's data, and every cached slot holds its
// index.
func (c *logCache) check() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.hi < c.lo {
		if c.hi+1 != c.lo || c.bytes != 0 {
			return fmt.Errorf("empty run [%d, %d] with %d bytes", c.lo, c.hi, c.bytes)
		}
		return nil
	}
	if n := c.hi - c.lo + 1; n > uint64(len(c.ring)) {
		return fmt.Errorf("run [%d, %d] of %d entries in a ring of %d", c.lo, c.hi, n, len(c.ring))
	}
	sum := 0
	for i := c.lo; i <= c.hi; i++ {
		l := c.ring[i%uint64(len(c.ring))]
		if l.Index != i {
			return fmt.Errorf("slot of %d holds %d", i, l.Index)
		}
		sum += len(l.Data)
	}
	if sum != c.bytes || sum > c.maxBytes {
		return fmt.Errorf("run holds %d bytes, counted %d, bound %d", sum, c.bytes, c.maxBytes)
	}
	return nil
}

func TestLogCache_ServesRecentEntriesWithinItsBounds(t *testing.T) {
	store := &countingStore{InmemStore: raft.NewInmemStore()}
	c := newLogCache(store, 8, 1000)
	for i := uint64(1); i <= 20; i++ {
		if err := c.StoreLogs([]*raft.Log{testLog(i, 100)}); err != nil {
			t.Fatal(err)
		}
		if err := c.check(); err != nil {
			t.Fatalf("after %d: %v", i, err)
		}
	}
	// 8 entries of 100 B: the count bound, not the bytes, holds 13..20.
	var l raft.Log
	for i := uint64(13); i <= 20; i++ {
		if err := c.GetLog(i, &l); err != nil || l.Index != i || len(l.Data) != 100 || l.Data[0] != byte(i) {
			t.Fatalf("GetLog(%d) = %d, %d bytes, %v", i, l.Index, len(l.Data), err)
		}
	}
	if n := store.gets.Load(); n != 0 {
		t.Fatalf("%d reads of cached entries reached the store", n)
	}
	if err := c.GetLog(12, &l); err != nil || l.Index != 12 || store.gets.Load() != 1 {
		t.Fatalf("GetLog(12) = %d, %v after %d store reads; want it read from the store", l.Index, err, store.gets.Load())
	}

	// 300 B entries: the byte bound keeps 3 of them (900 B).
	for i := uint64(21); i <= 25; i++ {
		if err := c.StoreLog(testLog(i, 300)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	if c.lo != 23 || c.hi != 25 || c.bytes != 900 {
		t.Fatalf("cached [%d, %d], %d bytes; want [23, 25], 900", c.lo, c.hi, c.bytes)
	}

	// An entry larger than the cache is stored, not cached, and the run
	// starts again after it.
	if err := c.StoreLog(testLog(26, 1001)); err != nil {
		t.Fatal(err)
	}
	if err := c.check(); err != nil || c.hi >= c.lo {
		t.Fatalf("cached [%d, %d] after an entry larger than the cache (%v)", c.lo, c.hi, err)
	}
	if err := c.GetLog(26, &l); err != nil || len(l.Data) != 1001 {
		t.Fatalf("GetLog(26) = %d bytes, %v", len(l.Data), err)
	}
	if err := c.StoreLog(testLog(27, 10)); err != nil {
		t.Fatal(err)
	}
	if c.lo != 27 || c.hi != 27 {
		t.Fatalf("cached [%d, %d], want [27, 27]", c.lo, c.hi)
	}

	// A gap (a restart, a snapshot installed) starts the run again too.
	if err := c.StoreLog(testLog(40, 10)); err != nil {
		t.Fatal(err)
	}
	if err := c.check(); err != nil || c.lo != 40 || c.hi != 40 {
		t.Fatalf("cached [%d, %d] after a gap (%v)", c.lo, c.hi, err)
	}

	// A follower's log truncated and rewritten: nothing deleted is read
	// from the cache.
	if err := c.DeleteRange(40, 40); err != nil {
		t.Fatal(err)
	}
	if err := c.GetLog(40, &l); err != raft.ErrLogNotFound {
		t.Fatalf("GetLog of a deleted entry = %d, %v; want raft.ErrLogNotFound", l.Index, err)
	}
	rewritten := testLog(40, 5)
	rewritten.Term = 2
	if err := c.StoreLog(rewritten); err != nil {
		t.Fatal(err)
	}
	if err := c.GetLog(40, &l); err != nil || l.Term != 2 {
		t.Fatalf("GetLog(40) after the rewrite: term %d, %v; want 2", l.Term, err)
	}
}

// TestLogCache_KeepsNoProposal checks that the cache keeps a copy of each
// entry, not the raft.Log it was given: on the leader that is a field of
// the proposal's future, which holds the FSM's response too. raft.LogCache
// keeps the pointer, and fails this test.
func TestLogCache_KeepsNoProposal(t *testing.T) {
	type future struct {
		log      raft.Log
		response []byte
	}
	for _, tc := range []struct {
		name  string
		cache func(raft.LogStore) raft.LogStore
		keeps bool
	}{
		{"logCache", func(s raft.LogStore) raft.LogStore { return newLogCache(s, 64, 1<<20) }, false},
		{"raft.LogCache", func(s raft.LogStore) raft.LogStore {
			c, err := raft.NewLogCache(64, s)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cache(copyingStore{raft.NewInmemStore()})
			var freed atomic.Int64
			for i := uint64(1); i <= 10; i++ {
				f := &future{log: *testLog(i, 10), response: make([]byte, 4096)}
				runtime.AddCleanup(f, func(*atomic.Int64) { freed.Add(1) }, &freed)
				if err := c.StoreLogs([]*raft.Log{&f.log}); err != nil {
					t.Fatal(err)
				}
			}
			wait := 5 * time.Second // for cleanups to run after a collection
			if tc.keeps {
				wait = 300 * time.Millisecond
			}
			deadline := time.Now().Add(wait)
			for freed.Load() < 10 && time.Now().Before(deadline) {
				runtime.GC()
				time.Sleep(10 * time.Millisecond)
			}
			if kept := freed.Load() < 10; kept != tc.keeps {
				t.Fatalf("%d of 10 proposals freed with their entries cached; want them kept: %v", freed.Load(), tc.keeps)
			}
			var l raft.Log
			if err := c.GetLog(10, &l); err != nil || l.Index != 10 {
				t.Fatalf("GetLog(10) = %d, %v", l.Index, err)
			}
			runtime.KeepAlive(c)
		})
	}
}

// TestLogCache_AgreesWithItsStore runs random appends, truncations and
// reads and checks every read against the store behind the cache.
func TestLogCache_AgreesWithItsStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	store := raft.NewInmemStore()
	c := newLogCache(store, 16, 2000)
	next := uint64(1)
	for step := range 5000 {
		switch op := rng.IntN(10); {
		case op < 6: // append a few
			var logs []*raft.Log
			for range 1 + rng.IntN(4) {
				logs = append(logs, testLog(next, rng.IntN(700)))
				next++
			}
			if err := c.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
		case op < 7 && next > 3: // truncate the tail, as a follower does
			from := next - 1 - uint64(rng.IntN(3))
			if err := c.DeleteRange(from, next-1); err != nil {
				t.Fatal(err)
			}
			next = from
		case op < 8: // skip ahead, as after a snapshot is installed
			next += uint64(1 + rng.IntN(5))
		default:
		}
		if err := c.check(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for range 3 {
			idx := uint64(1 + rng.IntN(int(next)+2))
			var got, want raft.Log
			gerr := c.GetLog(idx, &got)
			werr := store.GetLog(idx, &want)
			if (gerr == nil) != (werr == nil) || got.Index != want.Index || got.Term != want.Term || !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("step %d: GetLog(%d) = (%d, %d bytes, %v), the store says (%d, %d bytes, %v)", step, idx, got.Index, len(got.Data), gerr, want.Index, len(want.Data), werr)
			}
		}
	}
}
