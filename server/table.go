package server

import (
	"iter"

	"github.com/google/btree"
)

// lockTable is the FSM's table: every entry (a held key, a key in a
// lock-delay, a key with waiters) by key, in key order. One B-tree of
// (key, entry) pairs serves both the lookups of apply and the paged,
// ordered walks of List, where a hash map for the lookups beside a B-tree
// of the keys for the walks kept each key twice: about 45 bytes of heap per
// held lease less (TestMemory_HeapPerLease), for a lookup of O(log n)
// string comparisons instead of a hash (at 100,000 keys, 4 levels).
//
// Reads may run concurrently (under fsm.mu's read lock); a write needs the
// write lock.
type lockTable struct {
	t *btree.BTreeG[tableItem]
}

// tableItem is one entry of a lockTable. A lookup passes a tableItem with
// the key alone: no entry is allocated to search with.
type tableItem struct {
	key string
	e   *lockEntry
}

// tableDegree is the B-tree's degree: nodes of up to 2×tableDegree-1 items.
const tableDegree = 32

func newLockTable() lockTable {
	return lockTable{t: btree.NewG(tableDegree, func(a, b tableItem) bool { return a.key < b.key })}
}

// get returns key's entry, nil when the table has none.
func (t lockTable) get(key string) *lockEntry {
	it, _ := t.t.Get(tableItem{key: key})
	return it.e
}

// put sets key's entry to e.
func (t lockTable) put(key string, e *lockEntry) { t.t.ReplaceOrInsert(tableItem{key: key, e: e}) }

// del removes key's entry.
func (t lockTable) del(key string) { t.t.Delete(tableItem{key: key}) }

// len returns the number of entries.
func (t lockTable) len() int { return t.t.Len() }

// ascend calls fn for each entry whose key is from or after, in key order,
// until fn returns false.
func (t lockTable) ascend(from string, fn func(key string, e *lockEntry) bool) {
	t.t.AscendGreaterOrEqual(tableItem{key: from}, func(it tableItem) bool { return fn(it.key, it.e) })
}

// all yields every entry with its key, in key order.
func (t lockTable) all() iter.Seq2[string, *lockEntry] {
	return func(yield func(string, *lockEntry) bool) {
		t.t.Ascend(func(it tableItem) bool { return yield(it.key, it.e) })
	}
}

// leaseIndex is the lease clock's countdowns of Exclusive grants and of
// keys' lock-delays (at most one a key), by key: a B-tree of the countdowns
// themselves, each of which holds its key, instead of a hash map of key to
// countdown (about 25 bytes of heap per held lease less,
// TestMemory_HeapPerLease). Every method needs leaseClock.mu: lookups
// search with probe, a countdown kept for it.
type leaseIndex struct {
	t     *btree.BTreeG[*lease]
	probe lease
}

func newLeaseIndex() *leaseIndex {
	return &leaseIndex{t: btree.NewG(tableDegree, func(a, b *lease) bool { return a.key < b.key })}
}

// get returns key's countdown, nil when none.
func (x *leaseIndex) get(key string) *lease {
	x.probe.key = key
	l, _ := x.t.Get(&x.probe)
	x.probe.key = ""
	return l
}

// put sets l's key's countdown to l.
func (x *leaseIndex) put(l *lease) { x.t.ReplaceOrInsert(l) }

// del removes key's countdown.
func (x *leaseIndex) del(key string) {
	x.probe.key = key
	x.t.Delete(&x.probe)
	x.probe.key = ""
}

// len returns the number of countdowns.
func (x *leaseIndex) len() int { return x.t.Len() }

// all yields every countdown, in key order.
func (x *leaseIndex) all() iter.Seq[*lease] {
	return func(yield func(*lease) bool) { x.t.Ascend(yield) }
}
