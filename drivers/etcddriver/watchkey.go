package etcddriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.KeyWatcher = (*Driver)(nil)

// WatchKey implements driver.KeyWatcher with an etcd watch on key's
// directory (<prefix>/.locks/<escaped key>/, every entry under it): any
// entry created or deleted there (a grant, a waiter queued or gone, a
// release, a lease expired or revoked) sends a notification. It returns
// once etcd has confirmed the watch (its created notification, within the
// op timeout), so every later change is seen. The channel is closed when
// ctx ends, the driver is closed, or the watch breaks (the connection lost,
// or the watched revision compacted); the watch holds nothing on the store.
// Errors: ErrInvalidKey; ErrClosed; ErrUnavailable when etcd does not
// confirm the watch in time.
func (d *Driver) WatchKey(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.CheckKey(key); err != nil {
		return nil, fmt.Errorf("etcddriver: watch: %w", err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, storeErr("watch", driver.ErrClosed)
	}
	d.wg.Add(1) // under d.mu, so that Close waits for this watch
	d.mu.Unlock()

	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.closeCtx, cancel)
	end := func(wch clientv3.WatchChan) {
		stop()
		cancel()
		for range wch { // the client closes it once wctx ends
		}
		d.wg.Done()
	}
	// WithRequireLeader: a member cut off from its quorum ends the watch
	// (the reader then reads again elsewhere) instead of staying silent.
	wch := d.cli.Watch(clientv3.WithRequireLeader(wctx), d.dir(key), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	t := time.NewTimer(d.opTimeout)
	defer t.Stop()
	select {
	case resp, ok := <-wch:
		var err error
		switch {
		case !ok:
			err = errors.New("watch channel closed before etcd confirmed it")
			if ctx.Err() != nil {
				err = ctx.Err()
			} else if d.closeCtx.Err() != nil {
				err = driver.ErrClosed
			}
		case resp.Err() != nil:
			err = resp.Err()
		case !resp.Created:
			// Not the created notification: an event already; the
			// watch is in place all the same.
		}
		if err != nil {
			go end(wch)
			return nil, storeErr("watch", err)
		}
	case <-t.C:
		go end(wch)
		return nil, storeErr("watch", fmt.Errorf("etcd did not confirm the watch within %v", d.opTimeout))
	case <-ctx.Done():
		go end(wch)
		return nil, storeErr("watch", ctx.Err())
	}

	out := make(chan struct{}, 1)
	go func() {
		defer end(wch)
		defer close(out)
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				return // compacted, cancelled, or no leader: broken
			}
			if len(resp.Events) > 0 {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, nil
}
