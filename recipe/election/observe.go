package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// DefaultPollInterval is how often Observe reads the leader on stores that
// cannot push changes (no driver.KeyWatcher), when WithPollInterval is not
// given. Each wait is drawn uniformly from [interval/2, interval], so that
// many observers do not read in step.
const DefaultPollInterval = 500 * time.Millisecond

// MinPollInterval is the shortest WithPollInterval, so that a mistake
// cannot flood the store.
const MinPollInterval = 10 * time.Millisecond

// watchRecheckFactor: with a pushed watch, Observe still reads the leader
// every watchRecheckFactor poll intervals, a safety net that costs little.
const watchRecheckFactor = 10

// ObserveOption configures Observe.
type ObserveOption func(*observeOptions)

type observeOptions struct {
	poll time.Duration
}

// WithPollInterval sets how often Observe reads the leader where the store
// cannot push changes (each wait is uniform in [d/2, d]); with a pushed
// watch it is the unit of the rare safety re-read (every 10 d). Zero value:
// DefaultPollInterval (500 ms). Below MinPollInterval (10 ms), Observe
// returns an error matching dlock.ErrInvalidArgument.
func WithPollInterval(d time.Duration) ObserveOption {
	return func(o *observeOptions) { o.poll = d }
}

// Observe delivers the leader of the election name on the returned
// channel: first the current one, then each new one as it is seen; the
// zero LeaderInfo (Term 0) means no leader (the last one resigned or was lost
// and nobody has won yet). The channel holds the latest value only: a slow
// reader skips leaders it did not read in time, never gets a stale one
// after a newer one, and never blocks the observer. Leaders are compared by
// term and value, so a leader seen twice is delivered once.
//
// Changes are pushed where the driver is a driver.KeyWatcher (dlockd's key
// watch, etcd watch, ZooKeeper watch): the watch is set up before the read
// it cues, so no change is missed; when a watch breaks the leader is read
// at once and the watch set up again after one poll interval (with a read
// after it), and a watched leader is still read every ten poll intervals,
// as a safety net. Elsewhere the leader is read
// every WithPollInterval (jittered), and at once on a release hint where
// the driver is a driver.Hinter (Redis). Store errors while observing
// (ErrUnavailable) are retried at the poll interval and deliver nothing.
//
// The channel is closed when ctx ends, when the Locker is closed, or when
// the store refuses to describe the key (ErrPermissionDenied); the goroutine
// behind it has ended once the channel is closed. Errors returned at once:
// dlock.ErrInvalidKey for a bad name, dlock.ErrInvalidArgument for a bad
// option, dlock.ErrUnsupported (naming the store) when the store cannot
// inspect (Redlock), and any error of the first read or watch
// (ErrUnavailable, ErrPermissionDenied, ctx.Err()), so that a caller
// learns of a misconfiguration rather than waiting on a silent channel.
func Observe(ctx context.Context, l *dlock.Locker, name string, opts ...ObserveOption) (<-chan LeaderInfo, error) {
	if l == nil {
		return nil, fmt.Errorf("election: observe %q: %w: nil Locker", name, dlock.ErrInvalidArgument)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("election: observe %q: name: %w", name, err)
	}
	o := observeOptions{poll: DefaultPollInterval}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.poll == 0 {
		o.poll = DefaultPollInterval
	}
	if o.poll < MinPollInterval {
		return nil, fmt.Errorf("election: observe %q: %w: poll interval %v is shorter than %v", name, dlock.ErrInvalidArgument, o.poll, MinPollInterval)
	}
	if _, ok := l.Driver().(driver.Inspector); !ok {
		return nil, fmt.Errorf("election: observe %q: %w: the store (%T) cannot inspect a key's holder", name, dlock.ErrUnsupported, l.Driver())
	}
	ob := &observer{l: l, name: name, o: o, out: make(chan LeaderInfo, 1)}
	ob.kw, _ = l.Driver().(driver.KeyWatcher)

	// The watch, then the first read: a change between them is notified.
	// Both run under a context the observer's goroutine owns.
	octx, cancel := context.WithCancel(ctx)
	if ob.kw != nil {
		w, err := ob.kw.WatchKey(octx, name)
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			ob.kw = nil // a wrapper over a store that cannot watch: poll
		case err != nil:
			cancel()
			return nil, fmt.Errorf("election: observe %q: watch: %w", name, dlockErr(err))
		default:
			ob.watch = w
		}
	}
	cur, err := ob.read(octx)
	if err != nil {
		cancel()
		ob.drainWatch()
		return nil, err
	}
	ob.out <- cur
	ob.last = cur
	if h, ok := l.Driver().(driver.Hinter); ok && ob.kw == nil {
		if hints, stop, err := h.Hint(octx, name); err == nil {
			ob.hints, ob.stopHints = hints, stop
		}
	}
	go ob.run(octx, cancel)
	return ob.out, nil
}

type observer struct {
	l     *dlock.Locker
	name  string
	o     observeOptions
	kw    driver.KeyWatcher
	out   chan LeaderInfo
	last  LeaderInfo
	watch <-chan struct{} // nil: no watch in place
	broke bool            // the watch broke in the last wait

	hints     <-chan struct{}
	stopHints func()
}

// read returns the current leader, the zero LeaderInfo when there is none.
func (ob *observer) read(ctx context.Context) (LeaderInfo, error) {
	cur, err := leader(ctx, ob.l, "observe", ob.name)
	if errors.Is(err, ErrNoLeader) {
		return LeaderInfo{}, nil
	}
	return cur, err
}

// dlockErr classifies a driver error of WatchKey as the root package does
// its own calls': sentinels pass through, anything else is ErrUnavailable.
func dlockErr(err error) error {
	switch {
	case errors.Is(err, dlock.ErrInvalidArgument), errors.Is(err, dlock.ErrUnavailable),
		errors.Is(err, dlock.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("%w: %w", dlock.ErrUnavailable, err)
}

// terminal reports whether a read error ends the observation: asking again
// cannot help.
func terminal(err error) bool {
	return errors.Is(err, dlock.ErrClosed) || errors.Is(err, dlock.ErrUnsupported) ||
		errors.Is(err, dlock.ErrInvalidArgument)
}

func (ob *observer) drainWatch() {
	if ob.watch == nil {
		return
	}
	for range ob.watch {
	}
	ob.watch = nil
}

func (ob *observer) run(ctx context.Context, cancel context.CancelFunc) {
	defer close(ob.out)
	defer func() {
		cancel()
		if ob.stopHints != nil {
			ob.stopHints()
		}
		ob.drainWatch()
	}()
	for {
		if !ob.wait(ctx) {
			return
		}
		switch {
		case ob.kw == nil || ob.watch != nil:
		case ob.broke:
			// The watch just broke: read now, and set it up again
			// after one poll interval, so that a store that ends
			// every watch at once costs one watch per interval, not a
			// busy loop.
			ob.broke = false
		default:
			// Set the watch up again before the read. Failing that,
			// this round is a poll.
			if w, err := ob.kw.WatchKey(ctx, ob.name); err == nil {
				ob.watch = w
			}
		}
		cur, err := ob.read(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && terminal(err):
			return
		case err != nil:
			continue // a store error: try again at the next poll
		}
		if cur != ob.last {
			ob.last = cur
			select { // latest wins: replace an unread value
			case <-ob.out:
			default:
			}
			ob.out <- cur
		}
	}
}

// wait blocks until the next read is due: a watch notification, a hint,
// or the (jittered) poll interval. It returns false when ctx ends.
func (ob *observer) wait(ctx context.Context) bool {
	d := jitter(ob.o.poll)
	if ob.watch != nil {
		d = jitter(watchRecheckFactor * ob.o.poll)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case _, ok := <-ob.watch: // nil channel: never
		if !ok {
			ob.watch, ob.broke = nil, true
		}
	case _, ok := <-ob.hints:
		if !ok {
			ob.hints = nil // the subscription ended: polls only
		}
	case <-t.C:
	}
	return true
}

// jitter returns a duration uniform in [d/2, d].
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
