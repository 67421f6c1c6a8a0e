package pgcommon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Channel returns the NOTIFY channel of one lock table: "dlock_" and 16 hex
// digits of SHA-256 of its qualified name, so that every table has its own
// channel within PostgreSQL's 63-byte limit.
func Channel(qualifiedTable string) string {
	sum := sha256.Sum256([]byte(qualifiedTable))
	return "dlock_" + hex.EncodeToString(sum[:8])
}

// ErrHubClosed is returned by Subscribe after Close.
var ErrHubClosed = errors.New("release hints closed")

// HubLinger is how long a Hub keeps its LISTEN connection after the last
// subscriber left, so that a key under steady contention does not reconnect
// for every wait.
const HubLinger = 10 * time.Second

// Hub turns NOTIFY messages on one channel (payload: the released key)
// into release hints for the keys subscribed. It keeps one LISTEN
// connection, opened when the first subscriber arrives and closed HubLinger
// after the last one left, reconnecting with jittered backoff when it drops. Hints
// are hints: a notification missed while reconnecting costs only latency
// (the subscribers are woken once after a reconnection).
type Hub struct {
	cfg     *pgx.ConnConfig
	channel string

	mu     sync.Mutex
	subs   map[string]map[chan struct{}]struct{}
	n      int
	cancel context.CancelFunc // stops the running listener; nil when none
	linger *time.Timer        // pending stop of an unused listener
	closed bool
	wg     sync.WaitGroup // listener goroutines
}

// NewHub returns a hub that listens on channel with connections made from
// cfg (which must come from pgx.ParseConfig or a pgxpool config).
func NewHub(cfg *pgx.ConnConfig, channel string) *Hub {
	return &Hub{cfg: cfg, channel: channel, subs: map[string]map[chan struct{}]struct{}{}}
}

// Subscribe returns a channel that receives a value (sent without blocking)
// whenever key may have been released, and the function that ends the
// subscription (safe to call more than once).
func (h *Hub) Subscribe(key string) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ErrHubClosed
	}
	ch := make(chan struct{}, 1)
	if h.subs[key] == nil {
		h.subs[key] = map[chan struct{}]struct{}{}
	}
	h.subs[key][ch] = struct{}{}
	h.n++
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	if h.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		h.wg.Add(1)
		go h.listen(ctx)
	}
	var once sync.Once
	stop := func() { once.Do(func() { h.unsubscribe(key, ch) }) }
	return ch, stop, nil
}

func (h *Hub) unsubscribe(key string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[key][ch]; !ok {
		return
	}
	delete(h.subs[key], ch)
	if len(h.subs[key]) == 0 {
		delete(h.subs, key)
	}
	h.n--
	if h.n == 0 && h.cancel != nil && h.linger == nil {
		var t *time.Timer
		t = time.AfterFunc(HubLinger, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.linger != t || h.n != 0 {
				return // a subscriber came back
			}
			h.linger = nil
			if h.cancel != nil {
				h.cancel()
				h.cancel = nil
			}
		})
		h.linger = t
	}
}

// Close ends every subscription's listener and waits for it to exit.
// Closing twice is a no-op.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	if h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// notify wakes the subscribers of key, or all of them when all is true.
func (h *Hub) notify(key string, all bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wake := func(subs map[chan struct{}]struct{}) {
		for ch := range subs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	if all {
		for _, subs := range h.subs {
			wake(subs)
		}
		return
	}
	wake(h.subs[key])
}

func (h *Hub) listen(ctx context.Context) {
	defer h.wg.Done()
	listened := false
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if h.listenOnce(ctx, listened) {
			listened = true
			attempt = 0
		}
		// Full-jitter backoff between reconnections, 10 ms to 2 s.
		ceiling := min(2*time.Second, 10*time.Millisecond<<min(attempt, 8))
		t := time.NewTimer(rand.N(ceiling) + time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listenOnce connects, LISTENs and forwards notifications until ctx ends or
// the connection fails. It reports whether LISTEN succeeded.
func (h *Hub) listenOnce(ctx context.Context, reconnect bool) bool {
	conn, err := pgx.ConnectConfig(ctx, h.cfg.Copy())
	if err != nil {
		return false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+Ident(h.channel)); err != nil {
		return false
	}
	if reconnect {
		h.notify("", true) // releases may have happened while not listening
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		h.notify(n.Payload, false)
	}
}
