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
// The subscription starts only once the grant has been held for
// watchDelay: most grants of a busy lock are released sooner, and a
// subscription would cost them two pub/sub round trips (SUBSCRIBE, then
// UNSUBSCRIBE) and a goroutine. A hint published before the subscription
// was confirmed reaches no one, so once it is confirmed the watch asks for
// one recheck: a force release within a grant's first watchDelay is found
// then (about watchDelay after the grant), not at its next renewal.
//
// A watch ends when this driver releases the grant, when a renewal finds it
// lost, when the grant has gone watchSlack past its TTL without a renewal
// through this driver (it has expired on Redis by then), or at Close.

// watchSlack is how long past its TTL an unrenewed grant stays watched.
const watchSlack = time.Second

// watchDelay is how long a grant is held before its recheck subscription
// starts.
const watchDelay = 100 * time.Millisecond

type grantID struct{ key, owner string }

// grantWatch is one watched grant. Its fields are guarded by the driver's
// watchMu.
type grantWatch struct {
	id        grantID
	since     time.Time // when the watch was registered
	recheck   chan struct{}
	cancel    context.CancelFunc // nil until the subscription starts
	timer     *time.Timer        // ends the watch at expiresAt; nil until the subscription starts
	expiresAt time.Time          // the watch ends at this time
}

// watch registers the recheck watch of a new grant and returns its
// channel, or nil when the driver has no hints (ReleaseHints off, or a
// client that cannot subscribe). The subscription starts watchDelay later,
// in the background, so TryAcquire does not wait for it: the driver keeps
// the new watches in a list, oldest first, that one timer sweeps (a grant
// released before the sweep costs no timer of its own).
func (d *Driver) watch(key, owner string, ttl time.Duration) <-chan struct{} {
	if d.hub == nil {
		return nil
	}
	now := time.Now()
	id := grantID{key, owner}
	w := &grantWatch{id: id, since: now, recheck: make(chan struct{}, 1), expiresAt: now.Add(ttl + watchSlack)}

	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.closed.Load() {
		return nil
	}
	if old := d.watches[id]; old != nil {
		// The same owner acquired again (a repeated attempt returns the
		// same grant): the newer watch replaces the older.
		old.stop()
	}
	d.watches[id] = w
	d.pending = append(d.pending, w)
	if d.sweep == nil {
		d.sweep = time.AfterFunc(watchDelay, d.sweepWatches)
	}
	return w.recheck
}

// sweepWatches starts the subscriptions of the pending watches registered
// watchDelay ago or more that are still held, drops the others that ended,
// and sets the timer for the next.
func (d *Driver) sweepWatches() {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.closed.Load() {
		d.pending, d.sweep = nil, nil
		return
	}
	now := time.Now()
	keep := d.pending[:0]
	for _, w := range d.pending {
		switch {
		case d.watches[w.id] != w: // released, lost or replaced
		case now.Sub(w.since) >= watchDelay:
			d.startWatch(w)
		default:
			keep = append(keep, w)
		}
	}
	clear(d.pending[len(keep):])
	d.pending = keep
	if len(keep) == 0 {
		d.sweep = nil
		return
	}
	d.sweep = time.AfterFunc(watchDelay-now.Sub(keep[0].since), d.sweepWatches)
}

// startWatch starts w's subscription and its expiry timer (watchMu held).
func (d *Driver) startWatch(w *grantWatch) {
	id := w.id
	w.timer = time.AfterFunc(time.Until(w.expiresAt), func() { d.watchTimer(id, w) })
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	d.watchWG.Add(1) // under watchMu, so never after stopWatches' Wait began
	_, _, channel := d.keys(id.key)
	go func() {
		defer d.watchWG.Done()
		hints, stop, err := d.hub.subscribe(ctx, channel)
		if err != nil {
			return // no hints: the heartbeat still finds the loss
		}
		defer stop()
		// A force release before the subscription was confirmed published
		// to no one: one renewal, once it is confirmed (subscribe stops
		// waiting for that after hintConfirmWait), finds it.
		if c := d.hub.confirmation(channel); c != nil {
			select {
			case <-c:
			case <-ctx.Done():
				return
			}
		}
		select {
		case w.recheck <- struct{}{}:
		default:
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-hints:
				select {
				case w.recheck <- struct{}{}:
				default:
				}
			}
		}
	}()
}

// watchTimer ends the watch once it is past its expiry (a renewal may have
// moved it).
func (d *Driver) watchTimer(id grantID, w *grantWatch) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.watches[id] != w {
		return
	}
	if left := time.Until(w.expiresAt); left > 0 {
		w.timer.Reset(left)
		return
	}
	w.stop()
	delete(d.watches, id)
}

func (w *grantWatch) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.cancel != nil {
		w.cancel()
	}
}

// renewed pushes the end of owner's watch on key to a TTL from now.
func (d *Driver) renewed(key, owner string, ttl time.Duration) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if w := d.watches[grantID{key, owner}]; w != nil {
		w.expiresAt = time.Now().Add(ttl + watchSlack)
		if w.timer != nil {
			w.timer.Reset(ttl + watchSlack)
		}
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

// stopWatches ends every watch and waits for their goroutines (Close).
func (d *Driver) stopWatches() {
	d.watchMu.Lock()
	for id, w := range d.watches {
		w.stop()
		delete(d.watches, id)
	}
	d.pending = nil
	if d.sweep != nil {
		d.sweep.Stop()
		d.sweep = nil
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
