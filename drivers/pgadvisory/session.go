package pgadvisory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
)

// errGone: the session ended before the caller could use its connection.
var errGone = errors.New("pgadvisory: session ended")

// session is one held lease: its dedicated connection and the goroutine
// that watches it.
//
// The connection is used by one party at a time. While nobody else needs
// it, the watcher blocks in WaitForNotification, which reads the socket and
// so returns the moment the session dies. A caller (renew, release) takes
// the connection with use: it interrupts the watcher, waits for it to step
// aside, runs its statement, and lets the watcher resume.
type session struct {
	d          *Driver
	conn       *pgxpool.Conn
	key, owner string
	id         int64
	lost       chan struct{}
	watchDone  chan struct{}

	mu        sync.Mutex
	cond      *sync.Cond
	users     int                // callers waiting for or using the connection
	inUse     bool               // a caller is using the connection
	watching  bool               // the watcher is blocked on the connection
	interrupt context.CancelFunc // ends the watcher's current wait
	stopping  bool               // the watcher must exit
	ended     bool               // the connection is gone: returned or closed
}

func newSession(d *Driver, c *pgxpool.Conn, key, owner string, id int64) *session {
	s := &session{
		d: d, conn: c, key: key, owner: owner, id: id,
		lost: make(chan struct{}), watchDone: make(chan struct{}),
	}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// watch blocks reading the idle connection until the session dies (then the
// lease is lost) or the watcher is stopped.
func (s *session) watch() {
	defer s.d.watchers.Done()
	defer close(s.watchDone)
	pg := s.conn.Conn().PgConn()
	for {
		s.mu.Lock()
		for s.users > 0 && !s.stopping {
			s.cond.Wait()
		}
		if s.stopping {
			s.mu.Unlock()
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.interrupt = cancel
		s.watching = true
		s.mu.Unlock()

		// No LISTEN was issued on this connection: nothing but an error
		// (the server terminating the session, a broken socket) or the
		// interruption ends this wait.
		err := pg.WaitForNotification(ctx)
		interrupted := ctx.Err() != nil
		cancel()
		// Read while the connection is still the watcher's alone.
		dead := err != nil && (!interrupted || pg.IsClosed())

		s.mu.Lock()
		s.watching = false
		s.interrupt = nil
		s.cond.Broadcast()
		s.mu.Unlock()
		if dead {
			s.end(true, true)
			return
		}
	}
}

// use runs fn on the connection, with the watcher set aside. It returns
// errGone when the session has ended.
func (s *session) use(fn func(c *pgxpool.Conn) error) error {
	s.mu.Lock()
	s.users++
	if s.interrupt != nil {
		s.interrupt()
	}
	for (s.watching || s.inUse) && !s.ended {
		s.cond.Wait()
	}
	if s.ended {
		s.users--
		s.cond.Broadcast()
		s.mu.Unlock()
		return errGone
	}
	s.inUse = true
	s.mu.Unlock()

	err := fn(s.conn)

	s.mu.Lock()
	s.inUse = false
	s.users--
	s.cond.Broadcast()
	s.mu.Unlock()
	return err
}

// stopWatcher makes the watcher exit and waits for it.
func (s *session) stopWatcher() {
	s.mu.Lock()
	s.stopping = true
	if s.interrupt != nil {
		s.interrupt()
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.watchDone
}

// end gives the connection up, once: closed (which ends the session and so
// drops the lock on the server) or returned to the pool. lost closes
// Grant.Lost. It waits for a caller using the connection to finish, so it
// must not be called from within use.
func (s *session) end(closeConn, lost bool) {
	s.mu.Lock()
	s.stopping = true
	if s.interrupt != nil {
		s.interrupt()
	}
	for s.inUse || s.watching {
		s.cond.Wait()
	}
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.cond.Broadcast()
	s.mu.Unlock()

	s.d.forget(s)
	if lost {
		close(s.lost)
	}
	if closeConn {
		destroy(s.conn)
	} else {
		s.conn.Release()
	}
}

// kill ends the session for the driver's Close: released cleanly when the
// connection answers within pgcommon.CloseGrace, else closed (which ends
// the session and so its lock all the same). Grant.Lost closes.
func (s *session) kill() {
	s.stopWatcher()
	ctx, cancel := context.WithTimeout(context.Background(), pgcommon.CloseGrace)
	defer cancel()
	unlocked, err := s.unlock(ctx)
	if errors.Is(err, errGone) {
		return
	}
	s.end(err != nil || !unlocked, true)
}

// unlock runs the release statement on the connection: it reports whether
// pg_advisory_unlock found the lock held.
func (s *session) unlock(ctx context.Context) (bool, error) {
	var (
		unlocked bool
		timeout  string
		notified int64
		syncOff  string
	)
	err := s.use(func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, s.d.sqlRelease, s.id, s.owner).Scan(&unlocked, &timeout, &notified, &syncOff)
	})
	return unlocked, err
}

func (s *session) renew(ctx context.Context, ttl time.Duration) error {
	classid, objid := int64(uint64(s.id)>>32), int64(uint32(s.id))
	var held bool
	err := s.use(func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, s.d.sqlRenew, timeoutSetting(ttl), classid, objid).Scan(&held)
	})
	switch {
	case errors.Is(err, errGone):
		return driver.ErrLeaseLost
	case err != nil:
		s.end(true, true)
		return fmt.Errorf("%w: pgadvisory: renew failed on the lease's connection, which was closed: %w", driver.ErrLeaseLost, err)
	case !held:
		s.end(true, true)
		return fmt.Errorf("%w: pgadvisory: the session no longer holds advisory lock %d", driver.ErrLeaseLost, s.id)
	}
	return nil
}

func (s *session) release(ctx context.Context) error {
	s.stopWatcher()
	unlocked, err := s.unlock(ctx)
	switch {
	case errors.Is(err, errGone):
		return driver.ErrLeaseLost
	case err != nil:
		s.end(true, false)
		return fmt.Errorf("pgadvisory: release: %w (the lease's connection was closed, which releases the lock)", err)
	case !unlocked:
		s.end(true, false)
		return fmt.Errorf("%w: pgadvisory: the session did not hold advisory lock %d", driver.ErrLeaseLost, s.id)
	}
	s.end(false, false)
	return nil
}
