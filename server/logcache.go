package server

import (
	"sync"

	"github.com/hashicorp/raft"
)

// logCache keeps the most recent Raft log entries in memory in front of the
// log store, as raft.LogCache does, with two differences that bound what it
// holds:
//
//   - it keeps a copy of each raft.Log, not the pointer Raft passes in. On
//     the leader that pointer is the log field of the proposal's future, so
//     raft.LogCache kept every cached entry's future alive, with the FSM's
//     response in it (a batch entry's results): after a burst of 100,000
//     grants, the last 4,096 entries' data, futures and results were about
//     15 MB of a settled dlockd's heap.
//   - it is bounded in bytes of entry data as well as in entries: a batch
//     entry may hold up to maxBatchBytes (256 KiB), so a cache bounded by
//     count alone could hold a gigabyte.
//
// What it caches is a contiguous run of indexes [lo, hi]: Raft appends in
// index order, and an entry that does not follow hi (after a truncation,
// or one larger than the byte bound) starts the run again. Reads outside
// it go to the store. Raft reads recent entries to replicate them to
// followers and, on a follower, to apply them, both shortly after they
// were stored, so a small cache serves nearly all of them.
type logCache struct {
	store    raft.LogStore
	maxBytes int

	mu     sync.RWMutex
	ring   []raft.Log // entry i at ring[i % len(ring)] for lo <= i <= hi
	lo, hi uint64     // the cached run; empty when hi < lo (lo = hi+1)
	bytes  int        // len(Data) summed over the run
}

// newLogCache returns a cache of at most entries entries and maxBytes bytes
// of entry data in front of store.
func newLogCache(store raft.LogStore, entries, maxBytes int) *logCache {
	return &logCache{store: store, maxBytes: maxBytes, ring: make([]raft.Log, entries), lo: 1}
}

// IsMonotonic implements raft.MonotonicLogStore for the store behind the
// cache (raft-wal is: Raft then deletes all logs after restoring a
// snapshot instead of leaving a gap).
func (c *logCache) IsMonotonic() bool {
	m, ok := c.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// GetLog implements raft.LogStore: the cached copy, else the store's.
func (c *logCache) GetLog(idx uint64, out *raft.Log) error {
	c.mu.RLock()
	if idx >= c.lo && idx <= c.hi {
		*out = c.ring[idx%uint64(len(c.ring))]
		c.mu.RUnlock()
		return nil
	}
	c.mu.RUnlock()
	return c.store.GetLog(idx, out)
}

// StoreLog implements raft.LogStore.
func (c *logCache) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: the store first, then, on success,
// the cache.
func (c *logCache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		c.add(l)
	}
	return nil
}

// add caches a copy of l; c.mu is held.
func (c *logCache) add(l *raft.Log) {
	if c.hi >= c.lo && l.Index != c.hi+1 {
		c.clear() // not the next entry of the run: start again
	}
	if len(l.Data) > c.maxBytes {
		c.clear() // larger than the whole cache: not cached
		return
	}
	if c.hi < c.lo {
		c.lo, c.hi = l.Index, l.Index-1
	}
	for c.hi >= c.lo && (c.hi-c.lo+1 >= uint64(len(c.ring)) || c.bytes+len(l.Data) > c.maxBytes) {
		c.evictOldest()
	}
	c.hi++
	c.ring[c.hi%uint64(len(c.ring))] = *l
	c.bytes += len(l.Data)
}

// evictOldest drops entry lo; c.mu is held and the run is not empty.
func (c *logCache) evictOldest() {
	slot := &c.ring[c.lo%uint64(len(c.ring))]
	c.bytes -= len(slot.Data)
	*slot = raft.Log{}
	c.lo++
}

// clear empties the cache; c.mu is held.
func (c *logCache) clear() {
	for i := c.lo; i <= c.hi; i++ {
		c.ring[i%uint64(len(c.ring))] = raft.Log{}
	}
	c.lo, c.hi, c.bytes = 1, 0, 0
}

// FirstIndex implements raft.LogStore.
func (c *logCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }

// LastIndex implements raft.LogStore.
func (c *logCache) LastIndex() (uint64, error) { return c.store.LastIndex() }

// DeleteRange implements raft.LogStore: the cache is emptied first (as
// raft.LogCache does), so no deleted entry can be read from it.
func (c *logCache) DeleteRange(lo, hi uint64) error {
	c.mu.Lock()
	c.clear()
	c.mu.Unlock()
	return c.store.DeleteRange(lo, hi)
}

// The server's log cache: enough for the entries Raft replicates and
// applies shortly after storing them (at 3 nodes, a second of entries is
// well under a MiB); older reads go to raft-wal.
const (
	logCacheEntries = 1024
	logCacheBytes   = 1 << 20
)
