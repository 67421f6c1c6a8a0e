package redisdriver

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/redislua"
)

// Waiting (driver.Waiter): a queue on Redis and a hand-off on release.
//
// Wait first makes one plain attempt (the acquire script, as TryAcquire).
// When the key is held, the waiter subscribes to the key's release channel,
// then runs the wait script, which grants a free key at once or appends the
// waiter's owner token to the key's queue ("P:{K}:queue", FIFO) with its TTL,
// holder and a liveness deadline of waiterLiveness on Redis's clock
// ("P:{K}:waiting"), and the channel on which to wake it: its driver's own
// ("P:wake:ID", see wakeChannel). Release, in the same script that deletes
// the grant, pops the queue's first live waiter and grants the key to it (a
// new fence from the shared counter, the waiter's owner token, holder and
// TTL) and publishes "grant:" and that owner token on that waiter's
// channel: one message to one connection, and only that waiter's Wait
// wakes (the driver's other waiters ignore it). It runs the wait
// script again, which finds its own grant, resets the expiry to the full
// TTL and returns the fence. One waiter per release, in queue order: no
// thundering herd, FIFO apart from newcomers that find the key free (after
// an expiry) before a queued waiter does. A force release (ForceRelease)
// hands the key on as a release does.
//
// Until it is claimed, a handed-off grant expires after handoffClaim (or
// its TTL, when shorter): a waiter that crashed, or lost the message, keeps
// the key from everyone for at most that long. The waiter's validity is
// measured from before its Wait began (the root package's rule), and the
// claim resets the expiry to a full TTL from later, so a claimed grant
// always outlives its validity deadline.
//
// Lost wake-ups: pub/sub is fire-and-forget (a dropped connection, a
// subscription not yet confirmed) and an expiry publishes nothing. So a queued
// waiter also polls, with full-jitter exponential backoff from
// waitPollMin up to waitPollMax ("Exponential Backoff And Jitter", AWS
// Architecture Blog, 2015): each poll is the wait script, which claims a
// hand-off that was not announced (within handoffClaim), takes a key that
// expired, and refreshes the waiter's liveness, so a live waiter keeps its
// place. A waiter that stopped refreshing (it crashed, or its process
// froze) for waiterLiveness is skipped by the next release. A lost wake-up
// costs latency, never safety: every grant is made by a script on Redis.
//
// When ctx ends, Wait removes its queue entry and releases a grant handed
// to it meanwhile (which hands the key to the next waiter), in one script,
// before it returns.
const (
	waitPollMin    = 10 * time.Millisecond
	waitPollMax    = 500 * time.Millisecond
	handoffClaim   = time.Second
	waiterLiveness = 3 * time.Second
)

// handoffClaimMs is handoffClaim in milliseconds, as the release script's
// argument (boxed once).
var handoffClaimMs any = handoffClaim.Milliseconds()

// defaultOpTimeout bounds one script of Wait when ctx carries no op
// timeout (driver.OpTimeout), as when Wait is called directly.
const defaultOpTimeout = 5 * time.Second

var _ driver.Waiter = (*Driver)(nil)

// KEYS: lock, shared counter, legacy counter, queue, waiting (lockKeys).
// ARGV: owner, ttl in ms, holder, liveness in ms, wake channel. A queue
// entry is "deadline ttl n channel holder" with n the channel's length
// (the channel and the holder may contain spaces). Returns the fence of the
// caller's grant (new, repeated or handed off to it), or 0 after queueing
// the caller (or refreshing its place) when another owner holds the key; it
// then marks the holder's hash (field q) so that its release looks at the
// queue (a release of a grant nobody queued behind skips it).
var waitScript = redis.NewScript(redislua.NextFence + `
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
  redis.call('HDEL', KEYS[5], ARGV[1])
  return tonumber(redis.call('HGET', KEYS[1], 'fence'))
end
if not cur then
  local fence = nextFence()
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, 'holder', ARGV[3], 'ttl', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[5], ARGV[1])
  if redis.call('LLEN', KEYS[4]) > 0 then
    redis.call('HSET', KEYS[1], 'q', '1')
  end
  return fence
end
redis.call('HSET', KEYS[1], 'q', '1')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = tonumber(ARGV[4])
local entry = (now + live) .. ' ' .. ARGV[2] .. ' ' .. string.len(ARGV[5]) .. ' ' .. ARGV[5] .. ARGV[3]
if redis.call('HSET', KEYS[5], ARGV[1], entry) == 1 then
  redis.call('RPUSH', KEYS[4], ARGV[1])
end
redis.call('PEXPIRE', KEYS[4], 2 * live)
redis.call('PEXPIRE', KEYS[5], 2 * live)
return 0
`)

// wakeChannel returns the channel on which a release tells this driver's
// waiters of a hand-off: one channel per driver ("P:wake:ID", ID random),
// so that a release wakes one connection, not every client subscribed to
// the key; on a Ring, whose shards do not share pub/sub, the key's own
// release channel (on the key's shard).
func (d *Driver) wakeChannel(keyChannel string) string {
	if d.hub.perChannel {
		return keyChannel
	}
	return d.ns + ":wake:" + d.wakeID
}

// Wait blocks until req.Key is granted to req.Owner or ctx ends (see
// "Waiting" above: a FIFO queue on Redis, a hand-off by Release, and polling
// only as the fallback). Each script is bounded by the op timeout that ctx
// carries (driver.OpTimeout; 5 s when none). When ctx ends first it removes
// the caller's queue entry and releases a grant that raced the end, then
// returns an error matching ctx.Err(). Without release hints (Options.
// ReleaseHints off, or a client that cannot subscribe) nothing is queued:
// Wait polls the acquire script with the same backoff. With
// Options.WaitReplicas, a grant (a free key, or one handed over and
// claimed) is returned only once that many replicas acknowledged the
// claim; otherwise it is released (which hands the key to the next
// waiter) and Wait returns an error matching driver.ErrUnavailable. Other
// errors are the store's, wrapped; the caller then releases req.Owner
// (Release also removes its queue entry).
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := d.checkOpen(); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redisdriver: wait: %w", err)
	}
	opTimeout := driver.OpTimeout(ctx)
	if opTimeout <= 0 {
		opTimeout = defaultOpTimeout
	}
	if err := d.checkReplicaWait("wait"); err != nil {
		return driver.Grant{}, err
	}
	keys, channel := d.lockKeys(req.Key)
	// The acquire script takes the first three keys, the wait script all.
	// A fence (n > 0) is a grant made, re-confirmed or handed over and now
	// claimed: with Options.WaitReplicas it is reported only once enough
	// replicas have it, and released otherwise (replicas.go).
	run := func(script *redis.Script, ks []string, args ...any) (int64, error) {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		s, err := d.session("wait")
		if err != nil {
			return 0, err
		}
		defer s.close()
		n, err := script.Run(octx, s.c, ks, args...).Int64()
		if err != nil {
			return 0, storeErr(octx, "wait", err)
		}
		if n > 0 {
			if err := d.replicated(octx, s, "wait", "the grant"); err != nil {
				return 0, d.dropLock(octx, &s, err, req.Key, req.Owner)
			}
		}
		return n, nil
	}
	// One plain attempt first: a free key costs one round trip, and a
	// held one leaves nothing on Redis until the waiter is subscribed.
	n, err := run(acquireScript, keys[:3], req.Owner, req.TTL.Milliseconds(), req.Holder)
	if err != nil {
		return driver.Grant{}, d.waitErr(ctx, req, err)
	}
	if n > 0 {
		return d.granted(req, n), nil
	}
	script, ks, args := acquireScript, keys[:3], []any{req.Owner, req.TTL.Milliseconds(), req.Holder}
	var hints <-chan struct{}
	if d.hub != nil {
		// Subscribed (and confirmed) before queueing, so the hand-off's
		// message finds the subscription.
		wake := d.wakeChannel(channel)
		h, stop, err := d.hub.subscribeFor(ctx, wake, req.Owner)
		if err == nil {
			defer stop()
			hints = h
			script, ks = waitScript, keys
			args = append(args, waiterLiveness.Milliseconds(), wake)
		}
	}
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return driver.Grant{}, d.leave(ctx, req)
		}
		n, err := run(script, ks, args...)
		if err != nil {
			return driver.Grant{}, d.waitErr(ctx, req, err)
		}
		if n > 0 {
			return d.granted(req, n), nil
		}
		if !pollWait(ctx, attempt, hints) {
			return driver.Grant{}, d.leave(ctx, req)
		}
	}
}

// granted is the grant of fence n to req.Owner.
func (d *Driver) granted(req driver.AcquireRequest, n int64) driver.Grant {
	return driver.Grant{Fence: uint64(n), Recheck: d.watch(req.Key, req.Owner, req.TTL)}
}

// waitErr is the error of a script of Wait that failed: when ctx has ended,
// the caller's queue entry and any grant are removed first.
func (d *Driver) waitErr(ctx context.Context, req driver.AcquireRequest, err error) error {
	if ctx.Err() != nil {
		_ = d.leave(ctx, req)
	}
	return err
}

// leave removes what req.Owner left on Redis (a queue entry, a grant handed
// to it) once ctx has ended, bounded by the op timeout, and returns the
// error of the ended wait, matching ctx.Err().
func (d *Driver) leave(ctx context.Context, req driver.AcquireRequest) error {
	opTimeout := driver.OpTimeout(ctx)
	if opTimeout <= 0 {
		opTimeout = defaultOpTimeout
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := d.Release(lctx, req.Key, req.Owner); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return fmt.Errorf("redisdriver: wait: %w (and removing the waiter failed: %w)", ctx.Err(), err)
	}
	return fmt.Errorf("redisdriver: wait: %w", ctx.Err())
}

// pollWait sleeps for a full-jitter backoff, uniform in
// [0, min(waitPollMax, waitPollMin·2^attempt)), or until a hint arrives. It
// returns false when ctx ends.
func pollWait(ctx context.Context, attempt int, hints <-chan struct{}) bool {
	ceiling := waitPollMax
	if attempt < 16 {
		ceiling = min(waitPollMax, waitPollMin<<attempt)
	}
	t := time.NewTimer(rand.N(ceiling) + time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-hints:
		return true
	}
}

// randomID returns 64 random bits, hex-encoded.
func randomID() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
