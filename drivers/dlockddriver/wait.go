package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Wait implements driver.Waiter over the server's Wait stream: it queues
// on the key's FIFO queue and returns when the server grants the key.
//
// A grant handed over to a waiter comes with a claim window
// (AcquireResponse.claim_within): the receiver must confirm it with a
// Renew within that time, or the server releases it to the next waiter, so
// that a waiter that vanished without closing its connection cannot keep
// the key for a whole TTL. Wait sends that Renew (with req.TTL) as soon as
// the grant arrives and returns the grant only once the renewal is
// acknowledged. When the renewal answers that the grant is gone (the window
// passed first), Wait queues again with the same owner token, until ctx
// ends. When ctx ends during the claim, Wait releases what the owner token
// may hold before it returns ctx's error; on any other failure of the
// renewal it returns that error, and the root package releases in the
// background.
//
// WaitUnconfirmed (below) skips the claim and leaves it to the caller.
//
// Claiming does not weaken the validity the root package computes: the root
// measures it from the moment it sent the wait request, which is before the
// server made the grant and so before the server's countdown started; the
// claim renewal then restarts that countdown at a full TTL later still. The
// client's deadline therefore always falls before the server's expiry. And
// the grant is returned only after the server acknowledged the claim, which
// it does only while the window is open and the owner token still holds the
// key: a grant already passed to the next waiter is never returned.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.wait(ctx, req, grantKind{}, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter: it is Wait without
// the claim. A grant handed over to the waiter is returned as soon as it
// arrives, with Grant.ConfirmWithin set to the server's claim window, and
// the caller's first Renew is the claim (the root package sends it as its
// lease's first renewal, a few milliseconds after the grant; a lease
// released sooner never sends it). The server's claim deadline is the
// handover plus the window, later than the call plus the window, which
// bounds the caller's validity until the claim is acknowledged.
func (d *Driver) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.wait(ctx, req, grantKind{}, true)
}

// wait is Wait for a grant of kind k (shared.go); unconfirmed returns a
// handed-over grant without claiming it (WaitUnconfirmed).
func (d *Driver) wait(ctx context.Context, req driver.AcquireRequest, k grantKind, unconfirmed bool) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: wait: %w", err)
	}
	if !d.handedOn.take(req.Key) {
		if g, settled, err := d.tryFirst(ctx, req, k); settled {
			return g, err
		}
	}
	for {
		if d.isClosed() {
			return driver.Grant{}, driver.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return driver.Grant{}, err
		}
		resp, err := d.waitOnce(ctx, req, k)
		if err != nil {
			return driver.Grant{}, err
		}
		g := d.grant(req, resp.GetFence())
		if resp.GetClaimWithin() == nil {
			return g, nil
		}
		if unconfirmed {
			// The caller claims it with its first renewal.
			g.ConfirmWithin = resp.GetClaimWithin().AsDuration()
			return g, nil
		}
		err = d.claim(ctx, req, resp.GetClaimWithin().AsDuration())
		switch {
		case err == nil:
			return g, nil
		case ctx.Err() != nil:
			d.forget(req.Key, req.Owner)
			return driver.Grant{}, d.releaseRaced(ctx, req)
		case errors.Is(err, driver.ErrLeaseLost):
			continue // not claimed in time: the next waiter has it; queue again
		default:
			d.forget(req.Key, req.Owner)
			return driver.Grant{}, err
		}
	}
}

// tryFirst asks for the key with a try-acquire on the Driver's Session
// stream before Wait opens a Wait stream. A free key (the common case of
// an uncontended lock) is then granted with one message each way on the
// stream the Driver keeps open, where a Wait stream costs a stream of its
// own per acquisition (its headers, window updates and end, several
// system calls on each side). A refused try costs the server no disk
// write and takes no place: a key with a queue is never free (a release
// hands it to the head waiter in the same entry), so trying first cannot
// overtake a waiter. It is skipped when this Driver's release of the key
// handed it to a waiter less than handedOnFor ago (handedOnKeys): the key
// is then held, and the try would only be refused.
//
// settled reports that the try decided the acquisition: a grant, or an
// error that queueing would meet too (an invalid request, a permission or
// a limit, the end of ctx). It is false when the key is held or in its
// lock-delay, or when the stream cannot run the call (not open, broken, not
// the leader's): the caller then queues with the same owner token, and a
// grant the try may have made before its answer was lost is returned by the
// wait (the server answers a repeat of the holder's owner token with its
// grant). The try is bounded as a queue entry's first answer is (the op
// timeout): a store that does not answer by then is a store error, as it
// would be for TryAcquire. When ctx ends while the try may have reached the
// server, what the owner token may hold is released before ctx's error is
// returned, as Wait does after a cancelled wait.
func (d *Driver) tryFirst(ctx context.Context, req driver.AcquireRequest, k grantKind) (g driver.Grant, settled bool, err error) {
	if d.calls.Load() == nil {
		return driver.Grant{}, false, nil
	}
	tctx, cancel := context.WithTimeout(ctx, answerTimeout(ctx))
	defer cancel()
	areq := d.acquireReq(req, false, k)
	sresp, fallback, sent, err := d.invoke(tctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Acquire{Acquire: areq}})
	switch {
	case err == nil && !fallback:
		return d.grant(req, sresp.GetAcquire().GetFence()), true, nil
	case ctx.Err() != nil:
		if !sent {
			return driver.Grant{}, true, ctx.Err()
		}
		return driver.Grant{}, true, d.releaseRaced(ctx, req)
	case fallback:
		return driver.Grant{}, false, nil
	}
	merr := mapErr(ctx, "acquire", req.Key, err)
	if errors.Is(merr, driver.ErrNotAcquired) {
		return driver.Grant{}, false, nil
	}
	return driver.Grant{}, true, merr
}

// handedOnKeys remembers the keys whose release by this Driver handed them
// to a waiter (ReleaseResponse.next_fence), for handedOnFor: a wait for
// such a key soon after finds it held by that waiter, so tryFirst's
// try-acquire would be refused (a round trip, and the server's work, for
// nothing, once per handoff in a queue of waiters that take turns) and the
// wait queues at once instead. Skipping the try is always safe: a wait on a
// free key is granted at once. At most maxHandedOn keys are kept (any one
// is dropped when full: the cost of a miss is one try).
type handedOnKeys struct {
	mu   sync.Mutex
	keys map[string]time.Time // key -> when its release handed it on
}

const (
	handedOnFor = time.Second
	maxHandedOn = 256
)

// note records that a release of key just handed it to a waiter.
func (h *handedOnKeys) note(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[string]time.Time)
	}
	if _, ok := h.keys[key]; !ok && len(h.keys) >= maxHandedOn {
		for k := range h.keys {
			delete(h.keys, k)
			break
		}
	}
	h.keys[key] = time.Now()
}

// take reports whether a release of key handed it on within handedOnFor,
// and forgets it.
func (h *handedOnKeys) take(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.keys[key]
	if !ok {
		return false
	}
	delete(h.keys, key)
	return time.Since(at) < handedOnFor
}

// claimMargin is how much longer than the claim window Wait waits for the
// claim renewal's answer before it gives up (a store error).
const claimMargin = time.Second

// claim confirms a handed-over grant with a renewal to a full TTL. It
// returns nil when the server acknowledged it, an error matching
// driver.ErrLeaseLost when the grant is gone, and another error when the
// renewal failed or was not answered within the claim window plus
// claimMargin (that error never matches a context error unless ctx ended).
func (d *Driver) claim(ctx context.Context, req driver.AcquireRequest, within time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, within+claimMargin)
	defer cancel()
	err := d.Renew(cctx, req.Key, req.Owner, req.TTL)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		return fmt.Errorf("dlockd: wait %q: the claim of a handed-over grant (claim window %v) was not answered in time", req.Key, within)
	}
	return err
}

// waitOnce queues on the Wait stream of the leader and returns the grant,
// or an error; when ctx ends it cancels the queue entry first (cancelWait).
//
// Leader changes: when the wait's stream breaks, answers NOT_LEADER, or
// the Driver learns that another member leads (a hint, or the Session
// loop's probe, confirmed by probing the stream's member), waitOnce sends
// the same request (same owner token) to the leader: the server keeps a
// queue entry of a waiter not connected to it for a grace period (the
// waiter's TTL) after an election, and a repeat of the same owner token
// re-attaches to it (QUEUED with its position) or, when the key was
// handed to it meanwhile, answers with the grant. It keeps re-attaching
// until ctx ends or, once the server acknowledged the wait, for that grace
// (max(req.TTL, the op timeout)) after contact was lost; past it the place
// is gone anyway and Wait returns a store error (after a best-effort
// cancellation in the background), so that the root package's outage
// handling takes over. A stream is closed, when the wait moves, only
// after its node was found not to lead: closing a wait's stream asks that
// node to remove the entry, which only the leader can do.
func (d *Driver) waitOnce(ctx context.Context, req driver.AcquireRequest, k grantKind) (*dlockv1.AcquireResponse, error) {
	d.waiting.Add(1)
	defer d.waiting.Add(-1)
	select {
	case d.waitStarted <- struct{}{}:
	default:
	}
	areq := d.acquireReq(req, true, k)
	ackBy := time.Now().Add(answerTimeout(ctx)) // the first acknowledgment's deadline
	grace := max(req.TTL, answerTimeout(ctx))
	var (
		acked   bool      // the server queued the wait (QUEUED) at least once
		lostAt  time.Time // when contact was lost after an acknowledgment
		sends   int       // requests sent so far
		moved   bool      // the wait changed streams
		pauses  int
		lastErr error
		cur     *waitStream
	)
	defer func() {
		if cur != nil {
			cur.close()
		}
	}()
	// pace counts a failed attempt and pauses (jittered) after a round of
	// members, or at once when the next attempt goes to the same member,
	// so that a stale hint naming a dead leader cannot make the wait spin.
	// It returns false when ctx ended during the pause.
	tries := 0
	pace := func(same bool, deadline time.Time) bool {
		tries++
		if !same && tries < d.cl.size() {
			return true
		}
		tries = 0
		w := jitter(pauses)
		pauses++
		if !deadline.IsZero() {
			w = min(w, max(time.Until(deadline), 0))
		}
		return sleepCtx(ctx, w)
	}
	m, changed := d.cl.current()
	for {
		var deadline time.Time
		switch {
		case !acked:
			deadline = ackBy
		case !lostAt.IsZero():
			deadline = lostAt.Add(grace)
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			d.cancelInBackground(req)
			if !acked {
				if lastErr != nil {
					return nil, fmt.Errorf("dlockd: wait %q: %w: no member acknowledged the wait within %v: %w", req.Key, driver.ErrUnavailable, answerTimeout(ctx), mapErr(ctx, "wait", req.Key, lastErr))
				}
				return nil, fmt.Errorf("dlockd: wait %q: %w: the server did not acknowledge the wait within %v", req.Key, driver.ErrUnavailable, answerTimeout(ctx))
			}
			return nil, fmt.Errorf("dlockd: wait %q: %w: lost contact with the leader for %v, the server's grace for a queued waiter; the queue place is gone (last error: %v)", req.Key, driver.ErrUnavailable, grace, lastErr)
		}
		if cur == nil {
			if ctx.Err() != nil {
				if sends == 0 {
					return nil, ctx.Err()
				}
				return nil, d.cancelWait(ctx, req, nil, true)
			}
			ws, err := d.openWait(ctx, m, areq, deadline)
			if err == nil {
				cur = ws
				sends++
				moved = moved || sends > 1
				continue
			}
			if ctx.Err() != nil {
				if sends == 0 {
					return nil, ctx.Err() // nothing was sent
				}
				return nil, d.cancelWait(ctx, req, nil, true)
			}
			lastErr = err
			next, ok := d.retryTarget(m, err, sends > 0)
			if ok && !acked && d.cl.size() == 1 && next == m {
				// One member, which cannot be reached or knows no leader,
				// and nothing queued yet: report it at once, as any call
				// (the root package retries).
				ok = false
			}
			if !ok {
				if sends > 0 {
					d.cancelInBackground(req)
				}
				return nil, mapErr(ctx, "wait", req.Key, err)
			}
			if !pace(next == m, deadline) {
				if sends == 0 {
					return nil, ctx.Err()
				}
				return nil, d.cancelWait(ctx, req, nil, true)
			}
			m = next
			_, changed = d.cl.current()
			continue
		}
		// Before the first acknowledgment, with other members to try, a
		// stream gets half the window: a frozen leader leaves time to ask
		// another member.
		streamBy := deadline
		if !acked && d.cl.size() > 1 {
			streamBy = cur.opened.Add(max(answerTimeout(ctx)/2, minAttempt))
			if streamBy.After(deadline) {
				streamBy = deadline
			}
		}
		var timeout <-chan time.Time
		var timer *time.Timer
		if !streamBy.IsZero() {
			timer = time.NewTimer(time.Until(streamBy))
			timeout = timer.C
		}
		// Without the Session loop nobody probes the leader: with other
		// members, the wait probes its stream's node itself.
		var probe <-chan time.Time
		var probeTimer *time.Timer
		if d.noSession && d.cl.size() > 1 {
			probeTimer = time.NewTimer(probeWaiting)
			probe = probeTimer.C
		}
		var ev recvd
		got, wasChanged, ended, probeOK := false, false, false, false
		select {
		case <-timeout:
		case r := <-cur.events:
			ev, got = r, true
		case <-changed:
			wasChanged = true
		case <-probe:
			if !d.confirmsLeader(ctx, cur.m) {
				if l, _ := d.cl.current(); l == cur.m {
					d.cl.demote(cur.m)
				}
				wasChanged = true
			} else {
				got = false
				wasChanged = false
				probeOK = true
			}
		case <-ctx.Done():
			ended = true
		}
		if timer != nil {
			timer.Stop()
		}
		if probeTimer != nil {
			probeTimer.Stop()
		}
		if probeOK {
			continue
		}
		switch {
		case !got && !wasChanged && !ended: // timeout
			if time.Now().Before(deadline) { // the stream's share ran out: the next member
				d.cl.demote(cur.m)
				cur.close()
				cur = nil
				m, changed = d.cl.current()
			}
		case got:
			r := ev
			if r.err != nil {
				lastErr = r.err
				next, ok := d.retryTarget(cur.m, r.err, true)
				if !ok {
					d.cancelInBackground(req)
					return nil, mapErr(ctx, "wait", req.Key, r.err)
				}
				// The stream broke or its node no longer leads: the queue
				// entry stays on the cluster for the grace; re-attach.
				same := next == cur.m
				cur.close()
				cur = nil
				if acked && lostAt.IsZero() {
					lostAt = time.Now()
				}
				if !pace(same, deadline) {
					return nil, d.cancelWait(ctx, req, nil, true)
				}
				m = next
				_, changed = d.cl.current()
				continue
			}
			switch r.ev.GetType() {
			case dlockv1.WaitEvent_QUEUED:
				acked, lostAt, pauses, tries = true, time.Time{}, 0, 0
			case dlockv1.WaitEvent_GRANTED:
				return r.ev.GetGrant(), nil
			case dlockv1.WaitEvent_CANCELLED: // not asked for: treat as an outage
				d.cancelInBackground(req)
				return nil, fmt.Errorf("dlockd: wait %q: cancelled by the server", req.Key)
			}
		case wasChanged:
			leader, ch := d.cl.current()
			changed = ch
			if leader == cur.m {
				continue
			}
			// A belief confirmed by the new leader itself (a quorum
			// answered it) is enough; a belief from a hint or a demotion
			// is checked with the stream's node first.
			if d.cl.confirmedLeader() != leader && d.confirmsLeader(ctx, cur.m) {
				continue
			}
			// Another member leads and the stream's node does not: move
			// the wait there (closing this stream cannot remove the entry:
			// only the leader can).
			cur.close()
			cur = nil
			if acked && lostAt.IsZero() {
				lostAt = time.Now()
			}
			m, _ = d.cl.current()
		case ended:
			ws := cur
			cur = nil
			// A wait that moved, or whose stream is not on the believed
			// leader, is also cancelled with the unary CancelWait on the
			// leader: a stream's cancellation only removes the entry when
			// its node leads.
			leader, _ := d.cl.current()
			return nil, d.cancelWait(ctx, req, ws, moved || ws.m != leader)
		}
	}
}

// retryTarget says where a wait goes after err (the failure to open or
// send on m's stream, or the stream's end): the leader a NOT_LEADER answer
// names (or the believed leader, or the next member), the next member
// after a connection failure, and the same member after DUPLICATE_WAIT on
// a re-send (the node's handler of the previous stream has not finished
// yet). ok is false when err is the server's answer: a refusal that ends
// the wait.
func (d *Driver) retryTarget(m *member, err error, resent bool) (next *member, ok bool) {
	if errors.Is(err, io.EOF) {
		// The stream ended with no terminal event and no status: never a
		// server's answer (its handler always ends with an event or an
		// error status), but a connection that closed under it (a killed
		// node's sockets close with a FIN). Re-attach, as after any other
		// broken link: the queue place is kept for the grace.
		return d.cl.next(m), true
	}
	kind, hint := classify(err, false)
	switch kind {
	case notLeader:
		if down, _ := d.cl.isDown(hint); down && hint != "" && hint != m.addr {
			// The named leader's address failed to connect: the next
			// member (the leader may answer at its URL address).
			return d.cl.next(m), true
		}
		if hint != "" && hint != m.addr {
			if h := d.cl.follow(hint); h != nil {
				return h, true
			}
		}
		if l, _ := d.cl.current(); l != m {
			return l, true
		}
		return d.cl.next(m), true
	case unreachable:
		if neverSent(err) {
			d.cl.markDown(m, err)
		}
		return d.cl.next(m), true
	}
	if st, _ := status.FromError(err); resent && st.Code() == codes.AlreadyExists && reasonOf(st.Message()) == reasonDuplicate {
		return m, true
	}
	return nil, false
}

// waitStream is one Wait stream on one member.
type waitStream struct {
	m      *member
	opened time.Time
	stream dlockv1.Lock_WaitClient
	cancel context.CancelFunc
	events chan recvd
}

// close ends the stream (the server removes the entry if its node leads).
func (w *waitStream) close() { w.cancel() }

// openWait opens a Wait stream on m and sends areq on it. The stream
// outlives ctx, so that a cancellation can be confirmed by the server; until
// the request is sent, ctx (and the deadline, when set, or else a share of
// the op timeout) still cut it.
func (d *Driver) openWait(ctx context.Context, m *member, areq *dlockv1.AcquireRequest, deadline time.Time) (*waitStream, error) {
	client, done, err := d.cl.waitClient(m)
	if err != nil {
		return nil, err
	}
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	var sentMu sync.Mutex
	sent := false
	cut := func() {
		sentMu.Lock()
		defer sentMu.Unlock()
		if !sent {
			scancel()
		}
	}
	stopEarly := context.AfterFunc(ctx, cut)
	defer stopEarly()
	limit := answerTimeout(ctx)
	if !deadline.IsZero() {
		limit = min(limit, max(time.Until(deadline), minAttempt))
	}
	if d.cl.size() > 1 {
		limit = max(limit/2, minAttempt)
	}
	timer := time.AfterFunc(limit, cut)
	defer timer.Stop()

	stream, err := client.Wait(sctx)
	if err == nil {
		sentMu.Lock()
		if sctx.Err() == nil {
			err = stream.Send(areq)
			sent = err == nil
		} else {
			err = status.Error(codes.Unavailable, "dlockd: wait: the stream did not open in time")
		}
		sentMu.Unlock()
	}
	if err != nil {
		scancel()
		done()
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, err
	}
	w := &waitStream{m: m, opened: time.Now(), stream: stream, cancel: scancel, events: make(chan recvd, 4)}
	go func() {
		// The stream has ended once Recv failed or its context was
		// cancelled: either way its HTTP/2 stream is free again.
		defer done()
		for {
			ev, err := stream.Recv()
			select {
			case w.events <- recvd{ev, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return w, nil
}

// answerTimeout is how long Wait waits for the server's first answer: the
// caller's op timeout (driver.OpTimeout), or 5 s.
func answerTimeout(ctx context.Context) time.Duration {
	if d := driver.OpTimeout(ctx); d > 0 {
		return d
	}
	return 5 * time.Second
}

// recvd is one result of a Wait stream's Recv.
type recvd struct {
	ev  *dlockv1.WaitEvent
	err error
}

// cancelWait removes the wait's queue entry after ctx ended, and returns
// ctx's error (joined with the cleanup's failure, if any). With a stream
// (ws), it asks on the stream first and waits for the answer; a grant that
// arrives first is released. The unary CancelWait, which goes to the leader
// whichever node that is (and which also releases a grant that raced),
// runs too when the stream's cancellation was not confirmed, or when
// unary is set (the wait moved between members, or its stream's node may
// not lead: a follower's cancellation removes nothing). Both are bounded by
// Options.CleanupTimeout.
func (d *Driver) cancelWait(ctx context.Context, req driver.AcquireRequest, ws *waitStream, unary bool) error {
	why := ctx.Err()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cleanup)
	defer cancel()
	confirmed := false
	if ws != nil {
		_ = ws.stream.CloseSend()
	wait:
		for {
			select {
			case r := <-ws.events:
				if r.err != nil {
					break wait // ended without CANCELLED: not confirmed
				}
				switch r.ev.GetType() {
				case dlockv1.WaitEvent_CANCELLED:
					confirmed = true
					break wait
				case dlockv1.WaitEvent_GRANTED:
					ws.close()
					return d.releaseRaced(ctx, req)
				}
			case <-cctx.Done():
				break wait
			}
		}
		ws.close()
	}
	if confirmed && !unary {
		return why
	}
	_, err := d.call(cctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) error {
		_, err := c.CancelWait(ctx, &dlockv1.CancelWaitRequest{Key: req.Key, Owner: req.Owner})
		return err
	})
	if err != nil {
		d.forget(req.Key, req.Owner)
		return errors.Join(why, fmt.Errorf("dlockd: wait %q: cancel not confirmed within %v: %w", req.Key, d.cleanup, mapErr(cctx, "cancel wait", req.Key, err)))
	}
	d.forget(req.Key, req.Owner)
	return why
}

// cancelInBackground removes, best effort and within
// Options.CleanupTimeout, the queue entry (or raced grant) that a wait
// ending with a store error may have left on the cluster. Close waits for
// it (and cuts it short).
func (d *Driver) cancelInBackground(req driver.AcquireRequest) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.watchWG.Add(1) // under d.mu, so never concurrently with Close's Wait
	d.mu.Unlock()
	go func() {
		defer d.watchWG.Done()
		ctx, cancel := context.WithTimeout(d.watchCtx, d.cleanup)
		defer cancel()
		_, _ = d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) error {
			_, err := c.CancelWait(ctx, &dlockv1.CancelWaitRequest{Key: req.Key, Owner: req.Owner})
			return err
		})
	}()
}

// releaseRaced releases, within the cleanup timeout, a grant the owner token
// may hold after ctx ended, and returns ctx's error (joined with the
// release's failure, if any).
func (d *Driver) releaseRaced(ctx context.Context, req driver.AcquireRequest) error {
	why := ctx.Err()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cleanup)
	defer cancel()
	err := d.Release(rctx, req.Key, req.Owner)
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return errors.Join(why, fmt.Errorf("dlockd: wait %q: release of a grant that raced the cancellation: %w", req.Key, err))
	}
	return why
}
