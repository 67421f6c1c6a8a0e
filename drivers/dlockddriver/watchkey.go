package dlockddriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

var _ driver.KeyWatcher = (*Driver)(nil)

// watchKeyTimeout bounds how long WatchKey waits for the server to
// acknowledge the watch (its READY event).
const watchKeyTimeout = 5 * time.Second

// WatchKey implements driver.KeyWatcher with a Watch stream of its own
// that names key (WatchRequest.keys): the server sends CHANGED whenever a
// grant of key is made or ends (a grant, handover, release, expiry, force
// release, a lock-delay's start or end) or its table is restored, and
// WatchKey's channel receives a value then. The stream runs under a fresh
// random session that holds no grant, so it carries no loss events; it
// holds nothing on the server once it ends. WatchKey returns once the
// server acknowledged the stream (READY, sent after the key is
// subscribed), within 5 s.
//
// The channel is closed when ctx ends, the driver is closed, or the stream
// breaks (the member restarts or shuts down, a leader change on a member
// that ends streams, WATCH_BACKLOG_FULL): the reader reads again and
// watches anew. A dlockd older than key watches acknowledges the stream but
// never sends CHANGED; readers that also poll now and then (as
// election.Observe does) still see changes, late. Errors: ErrInvalidKey;
// ErrClosed; ErrPermissionDenied; ErrUnavailable when the server did not
// acknowledge in time.
func (d *Driver) WatchKey(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.CheckKey(key); err != nil {
		return nil, fmt.Errorf("dlockd watch: %w", err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("dlockd watch: %w", driver.ErrClosed)
	}
	d.watchWG.Add(1) // under d.mu, so that Close waits for this stream
	d.mu.Unlock()

	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.watchCtx, cancel)
	end := func() {
		stop()
		cancel()
		d.watchWG.Done()
	}
	m, _ := d.cl.current()
	client, err := d.cl.client(m)
	if err != nil {
		end()
		return nil, mapErr(ctx, "watch", key, err)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	req := &dlockv1.WatchRequest{Session: "watchkey-" + hex.EncodeToString(b[:]), Keys: []string{key}}
	stream, err := client.Watch(wctx, req, waitForOne(d.cl)...)
	if err != nil {
		end()
		return nil, mapErr(ctx, "watch", key, err)
	}
	out := make(chan struct{}, 1)
	first := make(chan error, 1)
	go func() {
		defer end()
		defer close(out)
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
				continue // READY
			}
			if ev.GetType() == dlockv1.WatchEvent_CHANGED && ev.GetKey() == key {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	t := time.NewTimer(watchKeyTimeout)
	defer t.Stop()
	select {
	case err = <-first:
	case <-t.C:
		err = status.Error(codes.DeadlineExceeded, "dlockd: watch: not acknowledged in time")
	}
	if err != nil {
		cancel() // the reader ends with the stream
		return nil, mapErr(ctx, "watch", key, err)
	}
	return out, nil
}
