package dynamodbdriver

import (
	"sync"
	"time"
)

// observations remembers, per key, the record version this driver last
// read on a key held by another owner and when it first read it (this
// process's monotonic clock, taken when the read returned): the waiter's
// half of the record-version scheme. A version seen unchanged for the
// holder's whole lease lets the next attempt take the key over.
//
// Forgetting an observation is always safe (it only delays a takeover);
// keeping one is safe because a record version is never written twice.
type observations struct {
	mu sync.Mutex
	m  map[string]*observation
}

type observation struct {
	rvn   string
	at    time.Time     // when the read that first showed rvn returned
	lease time.Duration // the holder's lease, as written with rvn
	used  time.Time     // last looked at, for pruning
}

// maxObservations is the size past which observations that no attempt has
// looked at for pruneAfter are dropped.
const (
	maxObservations = 4096
	pruneAfter      = time.Minute
)

// get returns key's observation.
func (o *observations) get(key string) (observation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ob, ok := o.m[key]
	if !ok {
		return observation{}, false
	}
	ob.used = time.Now()
	return *ob, true
}

// see records that a read returning at readAt showed key held with record
// version rvn and lease, and returns when this driver first saw rvn.
func (o *observations) see(key, rvn string, lease time.Duration, readAt time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ob, ok := o.m[key]; ok && ob.rvn == rvn {
		ob.used = time.Now()
		return ob.at
	}
	if o.m == nil {
		o.m = map[string]*observation{}
	}
	if len(o.m) >= maxObservations {
		o.pruneLocked()
	}
	o.m[key] = &observation{rvn: rvn, at: readAt, lease: lease, used: time.Now()}
	return readAt
}

// forget drops key's observation (after a grant, or a write that found the
// item changed).
func (o *observations) forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, key)
}

func (o *observations) pruneLocked() {
	for k, ob := range o.m {
		if time.Since(ob.used) > pruneAfter {
			delete(o.m, k)
		}
	}
}

// len returns the number of observations kept.
func (o *observations) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}
