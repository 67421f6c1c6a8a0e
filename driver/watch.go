package driver

import "context"

// KeyWatcher is implemented by drivers whose store can push changes of one
// key's grant to a reader that holds nothing (dlockd's Watch stream with
// the key in WatchRequest.keys, an etcd watch on the key's entries, a
// ZooKeeper exists/children watch on the key's node). Observers of a lock
// (election.Observe: who leads now) use it to learn of a new holder
// without polling; where a driver is no KeyWatcher they poll with jittered
// backoff, woken early by Hinter hints.
//
// A notification says only "look again": it carries no state, may be
// spurious, and several changes may be coalesced into one. The reader then
// asks the store (Inspector.Inspect) for the current holder, so a missed or
// merged notification loses no state, only latency.
type KeyWatcher interface {
	// WatchKey starts watching key (a valid key: CheckKey; anything else
	// returns an error matching ErrInvalidKey). The returned channel
	// receives a value, sent without blocking (its buffer holds one
	// pending notification), whenever key's grant may have changed: a
	// grant, a release, an expiry, a force release, a handover. It is
	// closed when ctx ends or the watch breaks (a lost connection or
	// session); the reader then inspects again and, while it still
	// wants to watch, calls WatchKey anew. The watch holds nothing on the
	// store that outlives it, and every goroutine it starts has ended
	// once the channel is closed and drained.
	//
	// WatchKey returns once the watch is in place on the store, so that
	// every change after it returns is notified: a reader watches first
	// and inspects second, and misses nothing in between. A store error
	// at the start (the store not answering) is returned as any other
	// call's, with a nil channel. A driver that implements KeyWatcher
	// over a store that cannot watch (a wrapper that forwards the
	// capability) returns an error matching errors.ErrUnsupported: the
	// reader then polls, as for a driver that is no KeyWatcher.
	WatchKey(ctx context.Context, key string) (<-chan struct{}, error)
}
