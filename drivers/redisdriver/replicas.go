package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Waiting for replicas (Options.WaitReplicas; "Replicas and failover" in
// the package doc).
//
// Redis's WAIT numreplicas timeout (https://redis.io/docs/latest/commands/wait/)
// blocks until at least numreplicas replicas have acknowledged every write
// that the connection sending it made before, or until the timeout (in
// milliseconds; 0 would block forever), and returns how many did. It counts
// per connection, so an operation that must wait runs its script and then
// WAIT on one connection of its own (redis.Client.Conn, returned to the
// pool when the operation ends). The replication stream is one ordered
// log, so a WAIT that covers a script's writes also covers every write the
// primary made before them, whoever made it: a waiter's claim of a key
// handed over by another client's release (the claim resets the grant's
// expiry, a write after the hand-off's INCR and HSET) covers the hand-off.
//
// Where it applies: every path that tells its caller of a grant or a
// renewal, once its script answered with a grant (a new one, one
// re-confirmed by the same owner, or a hand-off claimed) — TryAcquire,
// Wait, Renew, Resume, and the read-write views' TryAcquire, Wait and
// Renew. A script that refused (the key held, a waiter queued) is not
// followed by WAIT: it granted nothing. Release and ForceRelease do not
// wait: a release that a failover loses only delays the next grant until
// the old one expires.
//
// A shortfall (fewer acknowledgements than WaitReplicas within the
// timeout, or WAIT failing) of an acquisition releases the grant, with the
// owner-checked release script, before the error is returned: nobody was
// told of it, so nobody works under it, and the key is free again at once
// rather than after the grant's TTL. A shortfall of a renewal or a resume
// changes nothing more: the grant stays, with the expiry the primary set,
// and the caller's validity still runs from its last confirmed renewal.

// DefaultWaitTimeout is how long one WAIT blocks when Options.WaitTimeout
// is zero.
const DefaultWaitTimeout = time.Second

// waitLate is how late Redis may answer a WAIT whose timeout has passed:
// it checks the timeouts of blocked clients when its event loop wakes,
// which, with no other traffic, is at its next cron tick (1/hz: 100 ms at
// the default hz 10). Measured: WAIT 1 0 with timeout 300 ms answers
// after 300 to 400 ms.
const waitLate = 100 * time.Millisecond

// releaseMin is the least time left before a call's deadline under which
// the release of an unreplicated grant still runs under the call's
// context; with less, it runs under a context of its own
// (unreplicatedReleaseTimeout).
const releaseMin = 50 * time.Millisecond

// unreplicatedReleaseTimeout bounds the release of a grant whose
// replication fell short when the call's context has ended (a cancelled
// caller) or has less than releaseMin left: like Wait's clean-up, it runs
// anyway, so that no grant that nobody was told of keeps the key for its
// TTL.
const unreplicatedReleaseTimeout = time.Second

// conner is the part of *redis.Client that Options.WaitReplicas needs: a
// connection of its own from the pool, on which WAIT counts the writes of
// the script that ran before it.
type conner interface {
	Conn() *redis.Conn
}

// replicaWait is a driver's WaitReplicas setting, checked once by New.
type replicaWait struct {
	n       int           // Options.WaitReplicas; 0: off
	timeout time.Duration // Options.WaitTimeout, defaulted, whole milliseconds, at least 1 ms
	conns   conner        // the client, when n > 0 and it has Conn
	err     error         // why the setting cannot work; nil when it can
}

// newReplicaWait checks o's WaitReplicas and WaitTimeout against client.
func newReplicaWait(client Client, o Options) replicaWait {
	w := replicaWait{n: o.WaitReplicas, timeout: o.WaitTimeout}
	switch {
	case o.WaitReplicas < 0:
		w.err = fmt.Errorf("%w: Options.WaitReplicas is %d, want 0 (off) or more", driver.ErrInvalidArgument, o.WaitReplicas)
		return w
	case o.WaitReplicas == 0:
		return replicaWait{} // WaitTimeout is ignored
	case o.WaitTimeout < 0:
		w.err = fmt.Errorf("%w: Options.WaitTimeout is %v, want 0 (the default, %v) or more", driver.ErrInvalidArgument, o.WaitTimeout, DefaultWaitTimeout)
		return w
	}
	if w.timeout == 0 {
		w.timeout = DefaultWaitTimeout
	}
	w.timeout = roundUpMs(w.timeout)
	c, ok := client.(conner)
	if !ok {
		w.err = fmt.Errorf("%w: Options.WaitReplicas (%d) needs a single-node *redis.Client (redis.NewClient, or redis.NewFailoverClient for Sentinel), "+
			"whose Conn runs a script and its WAIT on one connection; the client is a %T (a Redis Cluster, a Ring or another Scripter cannot say which replicas saw a write)",
			driver.ErrInvalidArgument, o.WaitReplicas, client)
		return w
	}
	w.conns = c
	return w
}

// parseReplicaWait sets o.WaitReplicas and o.WaitTimeout from the URL
// options wait_replicas and wait_timeout, when present, and removes them
// from q (go-redis refuses options it does not know). A malformed or
// negative value (or a wait_timeout that is not positive) is an error
// matching driver.ErrInvalidArgument.
func parseReplicaWait(q url.Values, o *Options) error {
	if q.Has("wait_replicas") {
		v := q.Get("wait_replicas")
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return urlparam.Invalid("redisdriver: URL option wait_replicas=%q is not a non-negative integer (the number of replicas that must acknowledge each grant and renewal; 0 is off)", v)
		}
		o.WaitReplicas = n
		q.Del("wait_replicas")
	}
	if q.Has("wait_timeout") {
		v := q.Get("wait_timeout")
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 {
			return urlparam.Invalid("redisdriver: URL option wait_timeout=%q is not a positive duration (e.g. 500ms, 2s)", v)
		}
		o.WaitTimeout = t
		q.Del("wait_timeout")
	}
	return nil
}

// roundUpMs rounds d > 0 up to whole milliseconds, at least one.
func roundUpMs(d time.Duration) time.Duration {
	return max((d+time.Millisecond-1)/time.Millisecond, 1) * time.Millisecond
}

// session is where one operation runs its scripts: the driver's client, or,
// with Options.WaitReplicas, one connection of it, so that WAIT there counts
// exactly the operation's writes (and every write before them).
type session struct {
	c    Client
	conn *redis.Conn // nil when WaitReplicas is 0
}

// session returns the session of one operation (op names it in errors).
// The caller must close it. It returns an error matching
// driver.ErrInvalidArgument when Options.WaitReplicas cannot work with the
// driver's client or is invalid; nothing has been sent then.
func (d *Driver) session(op string) (session, error) {
	if d.repl.n == 0 && d.repl.err == nil {
		return session{c: d.client}, nil
	}
	if d.repl.err != nil {
		return session{}, fmt.Errorf("redisdriver: %s: %w", op, d.repl.err)
	}
	conn := d.repl.conns.Conn()
	return session{c: conn, conn: conn}, nil
}

// checkReplicaWait returns the error of session, without taking a
// connection.
func (d *Driver) checkReplicaWait(op string) error {
	if d.repl.err != nil {
		return fmt.Errorf("redisdriver: %s: %w", op, d.repl.err)
	}
	return nil
}

// close returns the session's connection to the pool; closing again does
// nothing.
func (s *session) close() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}

// replicated returns nil once Options.WaitReplicas replicas have
// acknowledged the session's writes (at once when WaitReplicas is 0). It
// sends WAIT on the session's connection, blocking at most waitTimeout(ctx).
// Fewer acknowledgements is an error matching driver.ErrUnavailable that
// says how many of how many within how long; what names the write ("the
// grant", "the renewal"). A failed WAIT is the store's error wrapped
// (storeErr).
func (d *Driver) replicated(ctx context.Context, s session, op, what string) error {
	if s.conn == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisdriver: %s: %s was not confirmed on replicas: %w", op, what, err)
	}
	timeout := d.waitTimeout(ctx)
	acked, err := s.conn.Wait(ctx, d.repl.n, timeout).Result()
	if err != nil {
		return storeErr(ctx, op+": WAIT for "+what+" to reach replicas", err)
	}
	if acked < int64(d.repl.n) {
		return &shortfall{op: op, what: what, acked: acked, want: d.repl.n, within: timeout}
	}
	return nil
}

// waitTimeout is how long WAIT may block within ctx: Options.WaitTimeout,
// cut short of ctx's deadline by waitLate plus a tenth of the time left
// (for Redis's late answer, the reply and a release), but by no more than
// half the time left; in whole milliseconds, at least 1 ms (WAIT's 0 would
// mean forever).
func (d *Driver) waitTimeout(ctx context.Context) time.Duration {
	t := d.repl.timeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		left -= min(left/2, waitLate+left/10)
		if left < t {
			t = left
		}
	}
	if t < time.Millisecond {
		return time.Millisecond
	}
	return t.Truncate(time.Millisecond)
}

// shortfall is the error of a write that fewer replicas than
// Options.WaitReplicas acknowledged in time. It matches
// driver.ErrUnavailable.
type shortfall struct {
	op, what string
	acked    int64
	want     int
	within   time.Duration
	released string // for a grant: what became of it
}

func (e *shortfall) Error() string {
	msg := fmt.Sprintf("redisdriver: %s: %s was replicated to %d of %d replicas within %v", e.op, e.what, e.acked, e.want, e.within)
	if e.released != "" {
		msg += " (" + e.released + ")"
	}
	return msg + ": " + driver.ErrUnavailable.Error()
}

func (e *shortfall) Unwrap() error { return driver.ErrUnavailable }

// dropUnreplicated releases a grant that the caller will not be told of
// because replicated failed with err on session s, and returns err with
// what became of the grant. It closes s first, so that the release, which
// runs on the driver's client, never waits for the pooled connection that
// s holds (with pool_size=1 it would wait until the pool's timeout).
// release runs the
// owner-checked release script with the given context; it runs under
// ctx, or, once ctx has ended or has less than releaseMin left, under a
// context of its own bounded by unreplicatedReleaseTimeout (a release is
// one round trip; a grant left behind would keep the key from everyone for
// its TTL).
func dropUnreplicated(ctx context.Context, s *session, err error, release func(context.Context) error) error {
	s.close()
	rctx, cancel := context.WithCancel(ctx)
	dl, ok := ctx.Deadline()
	if ctx.Err() != nil || ok && time.Until(dl) < releaseMin {
		cancel()
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), unreplicatedReleaseTimeout)
	}
	rerr := release(rctx)
	cancel()
	var sf *shortfall
	if errors.As(err, &sf) {
		if rerr != nil {
			sf.released = fmt.Sprintf("releasing it failed: %v; it expires after its TTL", rerr)
		} else {
			sf.released = "released"
		}
		return err
	}
	if rerr != nil {
		return fmt.Errorf("%w (the grant could not be confirmed on the replicas, and releasing it failed: %v; it expires after its TTL)", err, rerr)
	}
	return fmt.Errorf("%w (the grant could not be confirmed on the replicas and was released)", err)
}

// dropLock is dropUnreplicated for owner's grant on a plain lock key.
func (d *Driver) dropLock(ctx context.Context, s *session, err error, key, owner string) error {
	d.unwatch(key, owner)
	keys, channel := d.lockKeys(key)
	if !d.hints {
		channel = ""
	}
	return dropUnreplicated(ctx, s, err, func(ctx context.Context) error {
		return releaseScript.Run(ctx, d.client, keys, owner, channel, handoffClaimMs).Err()
	})
}
