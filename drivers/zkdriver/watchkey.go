package zkdriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.KeyWatcher = (*Driver)(nil)

// WatchKey implements driver.KeyWatcher with ZooKeeper watches on key's
// container node: a children watch (getChildren with watch) while the
// node exists, an exists watch for its creation while it does not. A
// ZooKeeper watch fires once, so after each event the watch is set again
// before the notification is sent: a reader that inspects after a
// notification misses no later change. Any node of the key created or
// deleted (a grant, a waiter, a release, an expiry, a session's ephemeral
// nodes removed) sends a notification.
//
// It returns once the first watch is set. The channel is closed when ctx
// ends, the driver is closed, the ZooKeeper session's connected period
// ends (a disconnect or an expiry: watches of that period cannot be
// trusted), or a watch cannot be set again within the op timeout. A watch
// left set on the server when the channel closes costs it a few bytes
// until it fires once or the session ends (ZooKeeper has no cheap way to
// remove one); it holds no node and no grant. Errors: ErrInvalidKey;
// ErrClosed; ErrUnavailable (no session, or the server did not answer
// within the op timeout).
func (d *Driver) WatchKey(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.CheckKey(key); err != nil {
		return nil, fmt.Errorf("zkdriver: watch: %w", err)
	}
	gen, err := d.current()
	if err != nil {
		return nil, storeErr("watch", err)
	}
	ev, err := d.armWatch(ctx, key)
	if err != nil {
		return nil, storeErr("watch", err)
	}
	if !d.track() {
		return nil, storeErr("watch", driver.ErrClosed)
	}
	out := make(chan struct{}, 1)
	go func() {
		defer d.wg.Done()
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.closeCtx.Done():
				return
			case <-gen.lost:
				return
			case e, ok := <-ev:
				if !ok || e.Type == zk.EventNotWatching || e.Err != nil {
					return
				}
				ev, err = d.armWatch(ctx, key)
				if err != nil {
					return // closing tells the reader to look again
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, nil
}

// armWatch sets one watch on key's container node: on its children while
// it exists, on its creation while it does not. Bounded by the op timeout.
func (d *Driver) armWatch(ctx context.Context, key string) (<-chan zk.Event, error) {
	dir := d.dir(key)
	octx, cancel := context.WithTimeout(ctx, d.opTimeout)
	defer cancel()
	return do(octx, d, func() (<-chan zk.Event, error) {
		// A node that comes or goes between the two calls is found by
		// the next round; three rounds are plenty.
		for range 3 {
			_, _, ch, err := d.conn.ChildrenW(dir)
			if err == nil {
				return ch, nil
			}
			if !errors.Is(err, zk.ErrNoNode) {
				return nil, err
			}
			ok, _, ch, err := d.conn.ExistsW(dir)
			if err != nil {
				return nil, err
			}
			if !ok {
				return ch, nil
			}
		}
		return nil, fmt.Errorf("%w: the node of the key came and went three times while a watch was set", driver.ErrUnavailable)
	}, nil)
}
