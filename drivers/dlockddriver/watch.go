package dlockddriver

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// This file owns loss push: the Lost channel of each grant this Driver made,
// the session's Watch stream that closes them, and the reasons the server
// gave, kept for the error of a later Renew or Release of the same grant.

type grantKey struct{ key, owner string }

// lostEntry is the Lost channel of one live grant.
type lostEntry struct {
	ch    chan struct{}
	fence uint64
}

// maxLossReasons bounds the loss reasons kept: a reason is only a detail of
// an error message, and the root package does not ask again after a pushed
// loss.
const maxLossReasons = 256

// grant registers the Lost channel of a new grant. With the Watch stream
// off (Options.NoWatch) or after Close, Grant.Lost stays nil. The Watch
// stream and the acquisition's answer travel apart, so the server's LOST
// for this very grant (a short TTL, a force release right after the grant)
// may have come first: markLost kept its fence, and the grant's Lost
// channel is then closed from the start.
func (d *Driver) grant(req driver.AcquireRequest, fence uint64) driver.Grant {
	g := driver.Grant{Fence: fence}
	k := grantKey{req.Key, req.Owner}
	d.mu.Lock()
	defer d.mu.Unlock()
	// An older grant's early news has another fence (fences only grow),
	// and is left to age out of early.
	f, seen := d.early.get(k)
	lostFirst := seen && f == fence
	if !lostFirst {
		d.reasons.remove(k) // of an earlier grant of the same owner token
	} else {
		// A registration left by an older grant of the owner token ended
		// with it: close it now, so that a later fence check does not
		// close it as unseen and overwrite this grant's reason.
		if e, ok := d.lost[k]; ok && e.fence < fence {
			close(e.ch)
			delete(d.lost, k)
		}
	}
	if !d.noWatch && d.watchCtx.Err() == nil && !d.closed {
		ch := make(chan struct{})
		if lostFirst {
			close(ch)
		} else {
			d.lost[k] = lostEntry{ch, fence}
		}
		g.Lost = ch
	}
	return g
}

// forget drops the Lost channel of a grant that ended without loss news.
func (d *Driver) forget(key, owner string) {
	d.mu.Lock()
	delete(d.lost, grantKey{key, owner})
	d.mu.Unlock()
}

// markLost closes the Lost channel of the grant (key, owner, fence) that the
// server ended without a release, and keeps the server's reason (EXPIRED,
// FORCE_RELEASED, UNCLAIMED). A fence that is not the registered grant's is
// an older grant of the same owner token (a waited grant that was not
// claimed in time, then granted again): the live grant is left alone. Fence
// 0 (a server that does not send it) matches any.
func (d *Driver) markLost(key, owner string, fence uint64, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := grantKey{key, owner}
	e, ok := d.lost[k]
	closed := ok && (fence == 0 || e.fence == fence)
	if closed {
		close(e.ch)
		delete(d.lost, k)
	}
	if !closed && fence != 0 && reason != reasonUnseen {
		// No grant registered for it (or an older one of the same owner
		// token still is: a handed grant whose claim failed): an older
		// grant's news, or this grant's, come before its acquisition's
		// answer was registered. grant tells them apart by the fence.
		d.early.put(k, fence)
	}
	if reason == "" || (reason == reasonUnseen && !closed) {
		// A fence check that closed nothing (the loss was pushed
		// meanwhile) keeps the server's own reason.
		return
	}
	d.reasons.put(k, reason)
}

// recent maps grants to what the Watch stream said of their losses,
// keeping at most maxLossReasons of them, the oldest forgotten first. It
// is guarded by the Driver's mu.
type recent[V any] struct {
	m     map[grantKey]V
	order []grantKey // m's keys, oldest first (a removed key's slot ages out)
}

func newRecent[V any]() recent[V] { return recent[V]{m: make(map[grantKey]V)} }

func (r *recent[V]) get(k grantKey) (V, bool) {
	v, ok := r.m[k]
	return v, ok
}

func (r *recent[V]) put(k grantKey, v V) {
	if _, seen := r.m[k]; !seen {
		for len(r.order) >= maxLossReasons {
			delete(r.m, r.order[0])
			r.order = r.order[1:]
		}
		r.order = append(r.order, k)
	}
	r.m[k] = v
}

func (r *recent[V]) remove(k grantKey) { delete(r.m, k) }

// lossReason describes why the server ended owner's grant on key, from the
// Watch stream's news, or returns "" when there was none.
func (d *Driver) lossReason(key, owner string) string {
	d.mu.Lock()
	r, _ := d.reasons.get(grantKey{key, owner})
	d.mu.Unlock()
	switch r {
	case "":
		return ""
	case "EXPIRED":
		return "the server expired it"
	case "FORCE_RELEASED":
		return "an operator force-released it"
	case "UNCLAIMED":
		return "it was handed over but not claimed within the claim window"
	case reasonUnseen:
		return "it ended while the driver's Watch stream was reconnecting or moving to another member (found by a fence check after the stream reopened)"
	}
	return "server reason " + r
}

// watchLoop keeps the session's Watch stream open until Close, and closes
// the Lost channel of each grant the server reports lost. Any member serves
// Watch (losses are applied from the log on every node); the loop prefers
// the believed leader: it opens the stream there, moves it when the belief
// moves (opening the new stream before it closes the old), and after a
// break reconnects to the leader, or to the next member when the leader
// cannot be reached.
//
// A stream hears only of the losses its member applies after the stream
// subscribed there, and members apply the log at different times. So a
// loss can reach no stream: applied while no stream was open (between a
// break and the reconnection: a killed leader's successor force-releasing
// or expiring a grant before this Driver reattached; or before the first
// stream was up), and on a planned move too, overlap or not: the new
// member (a new leader, ahead in the log) may apply a loss before the new
// stream subscribed, while the old member (a follower now, behind) applies
// it only after the old stream closed. Every stream opened, the first, one
// after a break and one after a move alike, is therefore followed by a
// fence check of the grants still believed live (recheckLost, through
// startRecheck; nothing to check, and no call, when there are none). The
// check is a linearizable read on the leader, begun after the new member
// acknowledged the stream (READY): a loss that member had applied by then
// was committed before the read, which finds it; a later one is applied
// there after the subscription, and pushed.
func (d *Driver) watchLoop() {
	defer d.watchWG.Done()
	ctx := d.watchCtx
	delay := 50 * time.Millisecond
	var cur *watchStream
	defer func() {
		if cur != nil {
			cur.stop()
		}
	}()
	var target *member // where to open next; nil: the believed leader
	broke := false     // a stream ended: losses may have gone unheard
	for ctx.Err() == nil {
		leader, changed := d.cl.current()
		if cur == nil || cur.m != leader {
			m := leader
			if cur == nil && target != nil {
				m = target
			}
			if broke && watchReopenHook != nil {
				watchReopenHook()
			}
			if cur != nil && watchMoveHook != nil {
				watchMoveHook(d.session, m.addr)
			}
			ws, err := d.openWatch(ctx, m)
			switch {
			case err == nil:
				if cur != nil {
					cur.stop()
				}
				// The first stream, one after a break or one after a
				// move: a loss may have reached none (see above).
				d.startRecheck(ctx)
				cur, target, delay, broke = ws, nil, 50*time.Millisecond, false
			case cur == nil:
				// Not even one stream: try another member after a pause.
				target = d.cl.next(m)
				if hint, ok := leaderHint(err); ok && hint != "" {
					if h := d.cl.byAddr(hint); h != nil {
						target = h
					}
				}
				if !sleepCtx(ctx, delay) {
					return
				}
				delay = min(delay*2, 2*time.Second)
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-cur.done:
			cur.stop()
			cur, broke = nil, true
			if !sleepCtx(ctx, delay) {
				return
			}
			delay = min(delay*2, 2*time.Second)
		case <-changed:
		}
	}
}

// watchReopenHook, when set (tests only: export_test.go), is called before
// each attempt to reopen the Watch stream after a break.
var watchReopenHook func()

// watchMoveHook, when set (tests only: export_test.go), is called with the
// Driver's session and the member's address before each attempt to move
// the Watch stream to another member while it is open.
var watchMoveHook func(session, addr string)

// reasonUnseen is the loss reason recheckLost records: the server's own
// reason went to no stream.
const reasonUnseen = "UNSEEN"

// startRecheck runs recheckLost after a Watch stream was acknowledged: at
// once when no pass runs, else once more when the running pass ends (it
// began before this stream was up, so it does not cover it). Passes never
// overlap, however often the stream moves.
func (d *Driver) startRecheck(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rechecking {
		d.recheckAgain = true
		return
	}
	d.rechecking = true
	d.watchWG.Add(1)
	go func() {
		defer d.watchWG.Done()
		for {
			d.recheckLost(ctx)
			d.mu.Lock()
			again := d.recheckAgain && ctx.Err() == nil
			d.recheckAgain = false
			d.rechecking = again
			d.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// recheckLost asks the server (CheckFence, a linearizable read) whether each
// grant with a Lost channel is still current, and closes the Lost channel
// of each that is not: its loss reached no Watch stream (see watchLoop).
// Errors leave a grant as it is (its renewals and its validity deadline
// still find a loss); a caller without the read permission on the keys
// (PERMISSION_DENIED) ends the check.
func (d *Driver) recheckLost(ctx context.Context) {
	type held struct {
		k     grantKey
		fence uint64
	}
	d.mu.Lock()
	grants := make([]held, 0, len(d.lost))
	for k, e := range d.lost {
		grants = append(grants, held{k, e.fence})
	}
	d.mu.Unlock()
	// A new stream comes with leader changes, when a check may be
	// answered "not the leader": ask again, for up to recheckBudget.
	deadline := time.Now().Add(recheckBudget)
	for _, g := range grants {
		for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
			cctx, cancel := context.WithTimeout(ctx, probeTimeout)
			cur, err := d.CheckFence(cctx, g.k.key, g.fence)
			cancel()
			if ctx.Err() != nil || errors.Is(err, driver.ErrPermissionDenied) {
				return
			}
			if err == nil {
				if !cur {
					d.markLost(g.k.key, g.k.owner, g.fence, reasonUnseen)
				}
				break
			}
			if time.Now().Add(delay).After(deadline) || !sleepCtx(ctx, delay) {
				break // left to the grant's renewals and validity deadline
			}
		}
	}
}

// recheckBudget bounds how long recheckLost asks again after errors.
const recheckBudget = 10 * time.Second

// watchStream is one open Watch stream, read by its own goroutine.
type watchStream struct {
	m      *member
	cancel context.CancelFunc
	done   chan struct{} // closed when the stream ended
}

// stop ends the stream and waits for its reader.
func (w *watchStream) stop() {
	w.cancel()
	<-w.done
}

// openWatch opens the session's Watch stream on m and returns once the
// server acknowledged it (READY, within probeTimeout), with a goroutine
// that applies the losses it reports until it ends.
func (d *Driver) openWatch(ctx context.Context, m *member) (*watchStream, error) {
	client, err := d.cl.client(m)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	stream, err := client.Watch(wctx, &dlockv1.WatchRequest{Session: d.session}, waitForOne(d.cl)...)
	if err != nil {
		cancel()
		return nil, err
	}
	first := make(chan error, 1)
	w := &watchStream{m: m, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		acked := false
		for {
			ev, err := stream.Recv()
			if err != nil {
				if !acked {
					first <- err
				}
				return
			}
			if !acked {
				acked = true
				first <- nil
			}
			if ev.GetType() == dlockv1.WatchEvent_LOST {
				d.markLost(ev.GetKey(), ev.GetOwner(), ev.GetFence(), ev.GetReason())
			}
		}
	}()
	t := time.NewTimer(probeTimeout)
	defer t.Stop()
	select {
	case err = <-first:
	case <-t.C:
		err = status.Error(codes.DeadlineExceeded, "dlockd: watch: not acknowledged in time")
	}
	if err != nil {
		w.stop()
		return nil, err
	}
	return w, nil
}
