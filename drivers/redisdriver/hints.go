package redisdriver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
)

// hintConfirmWait bounds how long Hint waits for Redis to confirm a new
// subscription. Past it Hint returns anyway: a hint that cannot arrive only
// costs latency.
const hintConfirmWait = 500 * time.Millisecond

// hubIdleClose is how long the shared pub/sub connection stays open without
// subscriptions before it is closed. Keeping it saves a dial and a
// handshake for each contended acquisition.
const hubIdleClose = 30 * time.Second

// hubLinger is how long a channel stays subscribed after its last
// subscriber left: a client that waits on a key again and again (each
// release hands it to another waiter, and this one queues anew) keeps one
// confirmed subscription instead of a SUBSCRIBE and an UNSUBSCRIBE per wait.
const hubLinger = time.Second

// subscriber is the pub/sub part of *redis.Client, *redis.ClusterClient and
// *redis.Ring.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// hub multiplexes the release-hint subscriptions of one driver. On a node or
// a cluster (where PUBLISH reaches every node) all channels share one pub/sub
// connection; on a Ring, whose shards are independent servers, each channel
// gets its own connection to the shard that owns its hash tag. A per-channel
// connection is closed when its channel is unsubscribed; the shared one
// hubIdleClose after its last channel is, so a driver that nobody waits on
// soon holds no pub/sub connection and runs no goroutine. close ends all.
type hub struct {
	sub        subscriber
	perChannel bool
	idleClose  time.Duration // hubIdleClose; shorter in tests
	lingerFor  time.Duration // hubLinger; shorter in tests

	subMu sync.Mutex // serializes SUBSCRIBE/UNSUBSCRIBE and connection changes

	mu     sync.Mutex // guards the fields below; never held across I/O
	closed bool
	shared *psConn // when !perChannel
	chans  map[string]*chanState
	idle   *time.Timer // closes an unused shared connection
	idleGn uint64      // generation of idle; a stale timer does nothing

	wg sync.WaitGroup // dispatcher goroutines
}

type chanState struct {
	subs      map[*hintSub]struct{}
	linger    *time.Timer   // unsubscribes hubLinger after the last subscriber left
	confirmed chan struct{} // closed when Redis confirms the subscription
	isConfirm bool
	conn      *psConn
}

// hintSub is one subscriber of a channel. A waiter's subscription (owner
// set, see Wait) is woken only by a hand-off to its own owner token
// ("grant:"+owner) or by a plain release hint; every other subscription
// (owner empty: Hint, grant rechecks) by every message.
type hintSub struct {
	c     chan struct{}
	owner string
}

// grantPrefix starts the message a release that hands the key to a queued
// waiter publishes: "grant:" and the waiter's owner token.
const grantPrefix = "grant:"

// wakes reports whether message m on the channel is for s.
func (s *hintSub) wakes(m string) bool {
	if s.owner == "" || len(m) < len(grantPrefix) || m[:len(grantPrefix)] != grantPrefix {
		return true
	}
	return m[len(grantPrefix):] == s.owner
}

type psConn struct{ ps *redis.PubSub }

func newHub(sub subscriber, perChannel bool) *hub {
	return &hub{sub: sub, perChannel: perChannel, idleClose: hubIdleClose, lingerFor: hubLinger, chans: map[string]*chanState{}}
}

// subscribe adds a subscriber to channel and waits (bounded by ctx and
// hintConfirmWait) until Redis has confirmed the subscription.
func (h *hub) subscribe(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	return h.subscribeFor(ctx, channel, "")
}

// subscribeFor is subscribe for a subscriber that only hand-offs to owner
// (and plain release hints) wake; owner "" is woken by every message.
func (h *hub) subscribeFor(ctx context.Context, channel, owner string) (<-chan struct{}, func(), error) {
	s := &hintSub{c: make(chan struct{}, 1), owner: owner}

	h.subMu.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.subMu.Unlock()
		return nil, nil, fmt.Errorf("redisdriver: hint: %w", driver.ErrClosed)
	}
	st := h.chans[channel]
	isNew := st == nil
	if isNew {
		st = &chanState{subs: map[*hintSub]struct{}{}, confirmed: make(chan struct{})}
		h.chans[channel] = st
	}
	st.subs[s] = struct{}{}
	if st.linger != nil {
		st.linger.Stop()
		st.linger = nil
	}
	confirmed := st.confirmed
	var conn *psConn
	needOpen := false
	if isNew {
		switch {
		case h.perChannel:
			conn, needOpen = &psConn{}, true
		case h.shared == nil:
			conn, needOpen = &psConn{}, true
			h.shared = conn
		default:
			conn = h.shared
			h.stopIdleLocked()
		}
		// Set before subscribing, so the dispatcher can match the
		// confirmation to this connection.
		st.conn = conn
	}
	h.mu.Unlock()

	if isNew {
		sctx, cancel := context.WithTimeout(ctx, hintConfirmWait)
		var err error
		if needOpen {
			err = h.open(sctx, conn, channel)
		} else {
			// A failed write still records the channel in go-redis, which
			// resubscribes when it reconnects.
			_ = conn.ps.Subscribe(sctx, channel)
		}
		cancel()
		if err != nil {
			h.mu.Lock()
			delete(h.chans, channel)
			if h.shared == conn {
				h.shared = nil
			}
			h.mu.Unlock()
			h.subMu.Unlock()
			return nil, nil, err
		}
	}
	h.subMu.Unlock()

	t := time.NewTimer(hintConfirmWait)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-t.C:
	case <-ctx.Done():
	}
	return s.c, sync.OnceFunc(func() { h.unsubscribe(channel, s) }), nil
}

// confirmation returns a channel closed once Redis has confirmed the
// subscription of channel, or nil when the hub has no subscription of it.
func (h *hub) confirmation(channel string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.chans[channel]; st != nil {
		return st.confirmed
	}
	return nil
}

// open starts c, a pub/sub connection subscribed to channel, and its
// dispatcher.
func (h *hub) open(ctx context.Context, c *psConn, channel string) (err error) {
	defer func() {
		// Ring.Subscribe panics when no shard is up.
		if r := recover(); r != nil {
			err = fmt.Errorf("redisdriver: subscribe %q: %v", channel, r)
		}
	}()
	c.ps = h.sub.Subscribe(ctx, channel)
	msgs := c.ps.ChannelWithSubscriptions()
	h.wg.Add(1)
	go h.dispatch(c, msgs)
	return nil
}

// dispatch forwards confirmations and hints from one connection until it is
// closed.
func (h *hub) dispatch(c *psConn, msgs <-chan any) {
	defer h.wg.Done()
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			if st := h.chans[m.Channel]; st != nil && st.conn == c {
				if !st.isConfirm {
					st.isConfirm = true
					close(st.confirmed)
				} else {
					// go-redis resubscribed after a reconnection: what
					// was published meanwhile reached no one, so every
					// subscriber is woken to look (a recheck renews, a
					// waiter polls).
					for s := range st.subs {
						select {
						case s.c <- struct{}{}:
						default:
						}
					}
				}
			}
			h.mu.Unlock()
		case *redis.Message:
			h.mu.Lock()
			if st := h.chans[m.Channel]; st != nil && st.conn == c {
				for s := range st.subs {
					if !s.wakes(m.Payload) {
						continue
					}
					select {
					case s.c <- struct{}{}:
					default:
					}
				}
			}
			h.mu.Unlock()
		}
	}
}

// unsubscribe removes s from channel. The channel stays subscribed for
// hubLinger after its last subscriber left (see drop).
func (h *hub) unsubscribe(channel string, s *hintSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.chans[channel]
	if st == nil {
		return
	}
	delete(st.subs, s)
	if len(st.subs) > 0 || h.closed || st.linger != nil {
		return
	}
	st.linger = time.AfterFunc(h.lingerFor, func() { h.drop(channel, st) })
}

// drop unsubscribes channel, when st is still its state and nobody has
// subscribed since its linger began, closing connections that nobody needs
// any more.
func (h *hub) drop(channel string, st *chanState) {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	if h.closed || h.chans[channel] != st || len(st.subs) > 0 {
		h.mu.Unlock()
		return
	}
	delete(h.chans, channel)
	var closeConn, unsub *psConn
	if h.perChannel {
		closeConn = st.conn
	} else {
		unsub = st.conn
		if len(h.chans) == 0 && h.shared != nil {
			h.stopIdleLocked()
			gen := h.idleGn
			h.idle = time.AfterFunc(h.idleClose, func() { h.closeIdle(gen) })
		}
	}
	h.mu.Unlock()

	if closeConn != nil && closeConn.ps != nil {
		_ = closeConn.ps.Close()
	}
	if unsub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), hintConfirmWait)
		// On error go-redis has still forgotten the channel, so it will not
		// resubscribe on reconnect.
		_ = unsub.ps.Unsubscribe(ctx, channel)
		cancel()
	}
}

func (h *hub) stopIdleLocked() {
	h.idleGn++
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
}

// closeIdle closes the shared connection when it is still unused since the
// timer of generation gen was set.
func (h *hub) closeIdle(gen uint64) {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	if h.closed || h.idleGn != gen || len(h.chans) > 0 || h.shared == nil {
		h.mu.Unlock()
		return
	}
	c := h.shared
	h.shared, h.idle = nil, nil
	h.mu.Unlock()
	if c.ps != nil {
		_ = c.ps.Close()
	}
}

// close ends every subscription and waits for the dispatchers to exit.
func (h *hub) close() {
	h.subMu.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.subMu.Unlock()
		return
	}
	h.closed = true
	h.stopIdleLocked()
	conns := map[*psConn]struct{}{}
	if h.shared != nil {
		conns[h.shared] = struct{}{}
	}
	for _, st := range h.chans {
		if st.conn != nil {
			conns[st.conn] = struct{}{}
		}
		if st.linger != nil {
			st.linger.Stop()
		}
	}
	h.shared = nil
	h.chans = map[string]*chanState{}
	h.mu.Unlock()
	h.subMu.Unlock()
	for c := range conns {
		if c.ps != nil {
			_ = c.ps.Close()
		}
	}
	h.wg.Wait()
}
