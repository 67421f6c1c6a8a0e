package dlockddriver

import (
	"time"

	"google.golang.org/grpc"

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
// off (Options.NoWatch) or after Close, Grant.Lost stays nil.
func (d *Driver) grant(req driver.AcquireRequest, fence uint64) driver.Grant {
	g := driver.Grant{Fence: fence}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.reasons, grantKey{req.Key, req.Owner}) // of an earlier grant of the same owner token
	if !d.noWatch && d.watchCtx.Err() == nil && !d.closed {
		ch := make(chan struct{})
		d.lost[grantKey{req.Key, req.Owner}] = lostEntry{ch, fence}
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
	if ok && (fence == 0 || e.fence == fence) {
		close(e.ch)
		delete(d.lost, k)
	}
	if reason == "" {
		return
	}
	if _, seen := d.reasons[k]; !seen {
		if len(d.reasonOrder) >= maxLossReasons {
			delete(d.reasons, d.reasonOrder[0])
			d.reasonOrder = d.reasonOrder[1:]
		}
		d.reasonOrder = append(d.reasonOrder, k)
	}
	d.reasons[k] = reason
}

// lossReason describes why the server ended owner's grant on key, from the
// Watch stream's news, or returns "" when there was none.
func (d *Driver) lossReason(key, owner string) string {
	d.mu.Lock()
	r := d.reasons[grantKey{key, owner}]
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
	}
	return "server reason " + r
}

// watchLoop keeps the session's Watch stream open until Close, and closes
// the Lost channel of each grant the server reports lost.
func (d *Driver) watchLoop() {
	defer d.watchWG.Done()
	ctx := d.watchCtx
	delay := 50 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := d.client.Watch(ctx, &dlockv1.WatchRequest{Session: d.session}, grpc.WaitForReady(true))
		if err == nil {
			for {
				ev, rerr := stream.Recv()
				if rerr != nil {
					break
				}
				delay = 50 * time.Millisecond
				if ev.GetType() == dlockv1.WatchEvent_LOST {
					d.markLost(ev.GetKey(), ev.GetOwner(), ev.GetFence(), ev.GetReason())
				}
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, 2*time.Second)
	}
}
