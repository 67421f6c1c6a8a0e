package pgcommon

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// CloseGrace is how long a driver's Close lets PostgreSQL answer before it
// gives up on a connection: statements in flight get this long to finish,
// then every socket the driver opened gets this long to be written to and
// read from. A healthy server on a LAN answers in far less; a server that
// is frozen (SIGSTOP, a stuck disk) never does, and pgx would otherwise
// wait up to 15 s per interrupted connection for its cancel request.
const CloseGrace = 100 * time.Millisecond

// ConnTracker keeps every socket dialled through its Wrap'ed dial function,
// so that a driver's Close can bound the pool's and the listener's shutdown
// by a deadline: pgxpool.Pool.Close waits for each connection's clean-up,
// which after an interrupted statement includes a cancel request on a new
// connection that a frozen server never answers. Abort sets a deadline on
// every tracked socket, on every later deadline pgx sets, and on every
// socket dialled afterwards.
type ConnTracker struct {
	mu      sync.Mutex
	conns   map[*trackedConn]struct{}
	aborted bool
	until   time.Time // deadline of every socket after Abort
}

// NewConnTracker returns an empty tracker.
func NewConnTracker() *ConnTracker {
	return &ConnTracker{conns: map[*trackedConn]struct{}{}}
}

// Wrap returns dial (nil: pgx's default, a net.Dialer with KeepAlive 5
// minutes) with every connection it makes tracked.
func (t *ConnTracker) Wrap(dial pgconn.DialFunc) pgconn.DialFunc {
	if dial == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, t: t}
		t.mu.Lock()
		t.conns[tc] = struct{}{}
		aborted, until := t.aborted, t.until
		t.mu.Unlock()
		if aborted {
			_ = c.SetDeadline(until)
		}
		return tc, nil
	}
}

// Abort gives every tracked socket, and every one dialled later, grace
// more time for I/O: past it reads and writes fail with a timeout, so no
// clean-up can wait on a server that does not answer.
func (t *ConnTracker) Abort(grace time.Duration) {
	t.mu.Lock()
	if !t.aborted {
		t.aborted = true
		t.until = time.Now().Add(grace)
	}
	until := t.until
	conns := make([]*trackedConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.Conn.SetDeadline(until)
	}
}

// Open returns how many tracked sockets are open.
func (t *ConnTracker) Open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// bound returns d, or the abort deadline when that is earlier or d is zero
// (no deadline) and the tracker was aborted.
func (t *ConnTracker) bound(d time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.aborted && (d.IsZero() || d.After(t.until)) {
		return t.until
	}
	return d
}

type trackedConn struct {
	net.Conn
	t    *ConnTracker
	once sync.Once
}

func (c *trackedConn) SetDeadline(d time.Time) error { return c.Conn.SetDeadline(c.t.bound(d)) }
func (c *trackedConn) SetReadDeadline(d time.Time) error {
	return c.Conn.SetReadDeadline(c.t.bound(d))
}
func (c *trackedConn) SetWriteDeadline(d time.Time) error {
	return c.Conn.SetWriteDeadline(c.t.bound(d))
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	err := c.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Detacher hands out the contexts of statements that must not be abandoned
// half-way (see Detach) and lets a driver's Close end them after all: Abort
// cancels every one still running, so Close never waits out a detached
// statement on a server that does not answer.
type Detacher struct {
	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	started bool
}

// Detach is the package Detach, with the result also ended by Abort.
func (a *Detacher) Detach(ctx context.Context) (context.Context, context.CancelFunc) {
	a.mu.Lock()
	if !a.started {
		a.ctx, a.cancel = context.WithCancel(context.Background())
		a.started = true
	}
	abort := a.ctx
	a.mu.Unlock()
	qctx, cancel := Detach(ctx)
	stop := context.AfterFunc(abort, cancel)
	return qctx, func() { stop(); cancel() }
}

// Abort cancels every detached context, current and future.
func (a *Detacher) Abort() {
	a.mu.Lock()
	if !a.started {
		a.ctx, a.cancel = context.WithCancel(context.Background())
		a.started = true
	}
	a.mu.Unlock()
	a.cancel()
}

// WaitGrace waits for wg, at most grace, and reports whether it finished.
func WaitGrace(wg *sync.WaitGroup, grace time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
