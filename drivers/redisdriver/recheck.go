package redisdriver

import (
	"context"
	"time"
)

// Recheck hints: while a grant made by this driver is held, the driver
// subscribes to its key's release channel ("P:{K}:released"), on which
// Release and ForceRelease publish. A message there means someone removed a
// grant of the key, maybe this one (dlock release --force), so the driver
// passes it on as Grant.Recheck and the root package renews at once: a
// force-released holder learns of its loss within a round trip, not at its
// next renewal. The message is only a hint (anyone who can PUBLISH can
// forge one, and a stale one may concern an earlier grant): the renewal, a
// check against the lock hash, decides.
//
// A watch ends when this driver releases the grant, when a renewal finds it
// lost, when the grant has gone watchSlack past its TTL without a renewal
// through this driver (it has expired on Redis by then), or at Close.

// watchSlack is how long past its TTL an unrenewed grant stays watched.
const watchSlack = time.Second

type grantID struct{ key, owner string }

type grantWatch struct {
	cancel context.CancelFunc
	expiry *time.Timer
}

// watch starts the recheck subscription of a new grant and returns its
// channel, or nil when the driver has no hints (ReleaseHints off, or a
// client that cannot subscribe). Subscribing runs in the background, so
// TryAcquire does not wait for it.
func (d *Driver) watch(key, owner string, ttl time.Duration) <-chan struct{} {
	if d.hub == nil {
		return nil
	}
	id := grantID{key, owner}
	recheck := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	w := &grantWatch{cancel: cancel}

	d.watchMu.Lock()
	if d.closed.Load() {
		d.watchMu.Unlock()
		cancel()
		return nil
	}
	if old := d.watches[id]; old != nil {
		// The same owner acquired again (a repeated attempt returns the
		// same grant): the newer watch replaces the older.
		old.stop()
	}
	d.watches[id] = w
	w.expiry = time.AfterFunc(ttl+watchSlack, func() { d.unwatchIf(id, w) })
	d.watchWG.Add(1)
	d.watchMu.Unlock()

	_, _, channel := d.keys(key)
	go func() {
		defer d.watchWG.Done()
		hints, stop, err := d.hub.subscribe(ctx, channel)
		if err != nil {
			return // no hints: the heartbeat still finds the loss
		}
		defer stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hints:
				select {
				case recheck <- struct{}{}:
				default:
				}
			}
		}
	}()
	return recheck
}

func (w *grantWatch) stop() {
	w.cancel()
	w.expiry.Stop()
}

// renewed pushes the end of owner's watch on key to a TTL from now.
func (d *Driver) renewed(key, owner string, ttl time.Duration) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if w := d.watches[grantID{key, owner}]; w != nil {
		w.expiry.Reset(ttl + watchSlack)
	}
}

// unwatch ends owner's watch on key, if any.
func (d *Driver) unwatch(key, owner string) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	id := grantID{key, owner}
	if w := d.watches[id]; w != nil {
		w.stop()
		delete(d.watches, id)
	}
}

// unwatchIf ends the watch of id when it is still w (its expiry timer
// fired).
func (d *Driver) unwatchIf(id grantID, w *grantWatch) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.watches[id] == w {
		w.stop()
		delete(d.watches, id)
	}
}

// stopWatches ends every watch and waits for their goroutines (Close).
func (d *Driver) stopWatches() {
	d.watchMu.Lock()
	for id, w := range d.watches {
		w.stop()
		delete(d.watches, id)
	}
	d.watchMu.Unlock()
	d.watchWG.Wait()
}

// watching reports how many grants the driver watches (for tests).
func (d *Driver) watching() int {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	return len(d.watches)
}
