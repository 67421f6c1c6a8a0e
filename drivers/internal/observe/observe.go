// Package observe is the waiter's half of the record-version lease scheme
// of Amazon's DynamoDB lock client, for stores that cannot expire a record
// by their own clock (DynamoDB, Google Cloud Storage): the holder rewrites
// its record with a new version on every renewal, and a waiter that has
// seen the same version unchanged for the holder's whole lease, measured
// on the waiter's own monotonic clock, may take the key over with a write
// conditioned on that version. No wall clock of another machine is ever
// read.
//
// Why it is safe: a holder's lease is valid until sent + TTL − drift,
// where sent is when it sent the write of the version the waiter saw. The
// waiter first saw that version in a read that returned after the write
// took effect, so after sent; waiting a full TTL from then ends after the
// holder's validity, and the takeover's write, conditioned on the version,
// fails if the holder renewed in between.
//
// A Table remembers, per key, the version a driver last read and when it
// first read it. Forgetting an entry is always safe: it only delays a
// takeover by one lease. Keeping one is safe because a version is never
// written twice (it is random, or a store-assigned generation).
package observe

import (
	"sync"
	"time"
)

// DefaultMax is the number of entries a zero Table keeps at most.
const DefaultMax = 4096

// pruneAfter is how long an entry no attempt has looked at is kept once
// the table is full.
const pruneAfter = time.Minute

// Table records observations of held keys. The zero value is ready to use
// and keeps at most DefaultMax entries. It is safe for concurrent use.
type Table struct {
	// Max bounds the number of entries; when full, entries unused for a
	// minute are dropped, then the least recently used ones. Zero value:
	// DefaultMax.
	Max int

	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	version string
	first   time.Time     // when the read that first showed version returned
	lease   time.Duration // the holder's lease, as written with version
	used    time.Time     // last looked at
}

// See records that a read of key which returned at readAt (a time.Now()
// reading, so with its monotonic clock) showed it held at version with
// the holder's lease, and returns when this table first saw that version:
// readAt when it is new (or the entry had been dropped).
func (t *Table) See(key, version string, lease time.Duration, readAt time.Time) (first time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[key]; ok && e.version == version {
		e.used = readAt
		e.lease = lease
		return e.first
	}
	if t.m == nil {
		t.m = map[string]*entry{}
	}
	if _, ok := t.m[key]; !ok && len(t.m) >= t.max() {
		t.pruneLocked(readAt)
	}
	t.m[key] = &entry{version: version, first: readAt, lease: lease, used: readAt}
	return readAt
}

// Expired reports whether version of key, as See recorded it, has been
// unchanged for its whole lease at now: the holder that wrote it has lost
// its lease by its own clock, and a write conditioned on version may take
// the key over. It is false when the table has no such entry.
func (t *Table) Expired(key, version string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[key]
	return ok && e.version == version && now.Sub(e.first) >= e.lease
}

// Remaining returns how much of version's lease is left at now, as far as
// this table has seen it (the lease in full when it has no entry for
// version): an upper bound of the holder's remaining validity.
func (t *Table) Remaining(key, version string, lease time.Duration, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[key]
	if !ok || e.version != version {
		return lease
	}
	return max(0, e.first.Add(e.lease).Sub(now))
}

// Forget drops key's entry (after a grant, a release, or a read that found
// the key free).
func (t *Table) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, key)
}

// Len returns the number of entries kept.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

func (t *Table) max() int {
	if t.Max > 0 {
		return t.Max
	}
	return DefaultMax
}

// pruneLocked makes room for one entry: it drops entries unused for
// pruneAfter, then, while still full, the least recently used one.
func (t *Table) pruneLocked(now time.Time) {
	for k, e := range t.m {
		if now.Sub(e.used) > pruneAfter {
			delete(t.m, k)
		}
	}
	for len(t.m) >= t.max() {
		var oldest string
		var at time.Time
		for k, e := range t.m {
			if oldest == "" || e.used.Before(at) {
				oldest, at = k, e.used
			}
		}
		delete(t.m, oldest)
	}
}
