package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
)

// Read-write locks (driver.SharedLocker)
//
// SharedView gives the two kinds of a read-write lock: Exclusive (the
// writer) and Shared with Limit 0 (the readers), kept by owner-checked Lua
// scripts over five keys of the lock name K (all with K's hash tag, so one
// script runs on one Redis Cluster node):
//
//	e(P):{e(K)}:rw     hash of grants: owner → "r|w:fence:ttl ms:holder",
//	                   and "|w" → the writer's owner token while one holds
//	e(P):{e(K)}:rwd    zset of grants: owner → deadline (ms, Redis's clock)
//	e(P):{e(K)}:rwq    zset of waiters: "r|owner" or "w|owner" → arrival (µs)
//	e(P):{e(K)}:rwqx   zset of waiters: member → deadline of the entry (ms)
//	e(P):{t(S)}:fences the slot's shared fence counter, as for plain locks
//
// ("|" is not a valid owner-token byte, so no owner is mistaken for the
// writer field or a queue member.) Every script first drops the grants and
// waiters whose deadline has passed by Redis's clock (TIME), so each grant
// has its own TTL, as a plain lock's PEXPIRE gives it; the keys themselves
// expire with their last deadline, so nothing outlives its grants.
//
// A writer is granted when the key has no grant and no live waiter queued
// before it; a reader when no writer holds the key and no writer waits
// before it (for TryAcquire: no writer waits at all). Waiters are queued
// only by Wait (the views are driver.Waiters): Wait registers the request in
// the queue at its first refused attempt and polls, with full-jitter backoff
// woken by the release hints of "e(P):{e(K)}:rw:released" when the driver
// has hints, refreshing its entry's deadline at each attempt. So a waiting
// writer holds back every later reader (writer preference, no writer is
// starved by a stream of readers), and readers queued before a writer go
// first (FIFO, as etcd's RWMutex and Curator's InterProcessReadWriteLock
// order them). A waiter that stops polling (crashed) loses its place when
// its entry's deadline (twice the op timeout plus a second) passes; one
// whose context ends removes its entry (and any grant that raced the
// cancellation) before Wait returns. TryAcquire never queues: a refused try
// changes nothing.
//
// Fences come from the slot's shared counter, as for plain locks, so they
// strictly increase in grant order across both kinds. Renew and Release are
// owner-checked as for plain locks and return driver.ErrLeaseLost when the
// owner's grant is gone. The views keep their own key space: a plain lock
// of K and the read-write lock K do not exclude each other. They do not
// push loss (no Grant.Lost, no Recheck; loss is found by renewal and the
// validity deadline) and are not Inspectors. The caveats of the package doc
// (asynchronous replication, persistence, clock jumps, evictions) apply
// unchanged, and so does Options.WaitReplicas: a grant that too few
// replicas acknowledged is released and reported as driver.ErrUnavailable,
// and such a renewal is driver.ErrUnavailable. Shared with a Limit (a counted
// semaphore) is not supported: SharedView returns an error matching
// errors.ErrUnsupported, and the semaphore recipe uses its portable permit
// slots.

var _ driver.SharedLocker = (*Driver)(nil)

// SharedView returns the view of a read-write lock kind (Exclusive, or
// Shared with Limit 0), a driver.Waiter. It returns an error matching
// driver.ErrInvalidArgument for an invalid kind, and one matching
// errors.ErrUnsupported for Shared with a Limit.
func (d *Driver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("redisdriver: shared view: %w", err)
	}
	if kind.Mode == driver.Shared && kind.Limit > 0 {
		return nil, fmt.Errorf("redisdriver: shared view: Redis keeps read-write locks, not counted permits (limit %d): %w", kind.Limit, errors.ErrUnsupported)
	}
	mode := "r"
	if kind.Mode == driver.Exclusive {
		mode = "w"
	}
	return &rwView{d: d, mode: mode}, nil
}

// rwView is one kind of a read-write lock: mode "r" (readers) or "w" (the
// writer).
type rwView struct {
	d    *Driver
	mode string
}

var _ driver.Waiter = (*rwView)(nil)

// rwKeys returns the script keys of key: the grants hash, the grants'
// deadlines, the queue, the queue entries' deadlines and the fence counter;
// and the release channel.
func (d *Driver) rwKeys(key string) ([]string, string) {
	tag := escape(key)
	base := d.ns + ":{" + tag + "}:rw"
	return []string{base, base + "d", base + "q", base + "qx", d.counterKey(slot(tag))}, base + ":released"
}

// rwPrelude reads Redis's clock and drops the grants and waiters whose
// deadlines have passed. KEYS as rwKeys.
const rwPrelude = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, o in ipairs(gone) do
  if redis.call('HGET', KEYS[1], '|w') == o then redis.call('HDEL', KEYS[1], '|w') end
  redis.call('HDEL', KEYS[1], o)
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local wgone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, m in ipairs(wgone) do redis.call('ZREM', KEYS[3], m) end
if #wgone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now) end
local function expireAll()
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', KEYS[1], ms)
    redis.call('PEXPIRE', KEYS[2], ms)
  end
  last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', KEYS[3], ms)
    redis.call('PEXPIRE', KEYS[4], ms)
  end
end
local function drop(owner)
  if not redis.call('HGET', KEYS[1], owner) then return 0 end
  redis.call('HDEL', KEYS[1], owner)
  redis.call('ZREM', KEYS[2], owner)
  if redis.call('HGET', KEYS[1], '|w') == owner then redis.call('HDEL', KEYS[1], '|w') end
  return 1
end
`

var (
	// ARGV: owner, mode ("r" or "w"), ttl ms, queue ("1" from Wait),
	// queue entry ttl ms, holder. Returns the fence, or 0 when refused.
	rwAcquireScript = redis.NewScript(rwPrelude + `
local owner, mode, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cur = redis.call('HGET', KEYS[1], owner)
if cur then
  redis.call('ZADD', KEYS[2], now + ttl, owner)
  expireAll()
  return tonumber(string.match(cur, '^%a:(%d+)'))
end
local member = mode .. '|' .. owner
local blocked
if mode == 'w' then
  blocked = redis.call('HLEN', KEYS[1]) > 0
else
  blocked = redis.call('HEXISTS', KEYS[1], '|w') == 1
end
if not blocked then
  local mine = redis.call('ZSCORE', KEYS[3], member)
  local ahead
  if mine then
    ahead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. mine)
  else
    ahead = redis.call('ZRANGE', KEYS[3], 0, -1)
  end
  for _, m in ipairs(ahead) do
    if mode == 'w' or string.sub(m, 1, 2) == 'w|' then
      blocked = true
      break
    end
  end
end
if blocked then
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[3], 'NX', nowus, member)
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), member)
    expireAll()
  end
  return 0
end
redis.call('ZREM', KEYS[3], member)
redis.call('ZREM', KEYS[4], member)
local fence = redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[1], owner, mode .. ':' .. fence .. ':' .. ttl .. ':' .. ARGV[6])
if mode == 'w' then redis.call('HSET', KEYS[1], '|w', owner) end
redis.call('ZADD', KEYS[2], now + ttl, owner)
expireAll()
return fence
`)
	// ARGV: owner, ttl ms. Returns 1, or 0 when owner holds no grant.
	rwRenewScript = redis.NewScript(rwPrelude + `
if not redis.call('HGET', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
expireAll()
return 1
`)
	// ARGV: owner, hint channel or "". Returns 1, or 0 when owner holds
	// no grant.
	rwReleaseScript = redis.NewScript(rwPrelude + `
if drop(ARGV[1]) == 0 then return 0 end
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], 'released') end
expireAll()
return 1
`)
	// ARGV: owner, mode, hint channel or "". Removes owner's queue entry
	// and any grant of owner (one that raced a cancelled wait). Returns 1.
	rwCancelScript = redis.NewScript(rwPrelude + `
local member = ARGV[2] .. '|' .. ARGV[1]
local n = redis.call('ZREM', KEYS[3], member) + drop(ARGV[1])
redis.call('ZREM', KEYS[4], member)
if n > 0 and ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], 'released') end
expireAll()
return 1
`)
)

// Close closes nothing: the parent driver owns the client.
func (v *rwView) Close() error { return nil }

func (v *rwView) kind() string {
	if v.mode == "w" {
		return "write"
	}
	return "read"
}

// acquireOp and renewOp name the view's operations in errors (constants:
// nothing is built on the hot path).
func (v *rwView) acquireOp() string {
	if v.mode == "w" {
		return "write acquire"
	}
	return "read acquire"
}

func (v *rwView) renewOp() string {
	if v.mode == "w" {
		return "write renew"
	}
	return "read renew"
}

// TryAcquire makes one attempt; it never queues. It returns
// driver.ErrNotAcquired when the key is write-locked, or (for a writer)
// read-locked, or when a waiting writer (for a writer: any waiter) comes
// first.
func (v *rwView) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := v.attempt(ctx, req, false, 0)
	if err == nil && g.Fence == 0 {
		err = fmt.Errorf("redisdriver: %s acquire: %w", v.kind(), driver.ErrNotAcquired)
	}
	return g, err
}

// attempt runs the acquire script once. A refused attempt returns a zero
// Grant and no error.
func (v *rwView) attempt(ctx context.Context, req driver.AcquireRequest, queue bool, queueTTL time.Duration) (driver.Grant, error) {
	d := v.d
	if err := d.checkOpen(); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redisdriver: %s acquire: %w", v.kind(), err)
	}
	op := v.acquireOp()
	s, err := d.session(op)
	if err != nil {
		return driver.Grant{}, err
	}
	defer s.close()
	keys, channel := d.rwKeys(req.Key)
	q := "0"
	if queue {
		q = "1"
	}
	n, err := rwAcquireScript.Run(ctx, s.c, keys, req.Owner, v.mode, req.TTL.Milliseconds(), q, queueTTL.Milliseconds(), req.Holder).Int64()
	if err != nil {
		return driver.Grant{}, storeErr(ctx, op, err)
	}
	if n <= 0 {
		return driver.Grant{}, nil
	}
	if err := d.replicated(ctx, s, op, "the grant"); err != nil {
		if !d.hints {
			channel = ""
		}
		return driver.Grant{}, dropUnreplicated(ctx, &s, err, func(ctx context.Context) error {
			return rwReleaseScript.Run(ctx, d.client, keys, req.Owner, channel).Err()
		})
	}
	return driver.Grant{Fence: uint64(n)}, nil
}

// Wait queues the request on its first refused attempt and polls, with
// full-jitter backoff (2 ms growing to 100 ms) woken early by release
// hints, until it is granted or ctx ends. Each attempt is bounded by the op
// timeout ctx carries (driver.OpTimeout; 5 s when none). When ctx ends, or
// an attempt fails, Wait removes its queue entry and any grant that raced
// (with a fresh context bounded by the op timeout) before it returns.
func (v *rwView) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d := v.d
	if err := d.checkOpen(); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redisdriver: %s wait: %w", v.kind(), err)
	}
	if err := d.checkReplicaWait(v.kind() + " wait"); err != nil {
		return driver.Grant{}, err
	}
	opTimeout := driver.OpTimeout(ctx)
	if opTimeout <= 0 {
		opTimeout = 5 * time.Second
	}
	queueTTL := 2*opTimeout + time.Second
	keys, channel := d.rwKeys(req.Key)
	var hints <-chan struct{}
	if d.hub != nil {
		if h, stop, err := d.hub.subscribe(ctx, channel); err == nil {
			defer stop()
			hints = h
		}
	}
	cancel := func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer ccancel()
		ch := ""
		if d.hints {
			ch = channel
		}
		_ = rwCancelScript.Run(cctx, d.client, keys, req.Owner, v.mode, ch).Err()
	}
	for attempt := 0; ; attempt++ {
		octx, ocancel := context.WithTimeout(ctx, opTimeout)
		g, err := v.attempt(octx, req, true, queueTTL)
		ocancel()
		if err == nil && g.Fence > 0 {
			return g, nil
		}
		if ctx.Err() != nil {
			cancel()
			return driver.Grant{}, fmt.Errorf("redisdriver: %s wait %q: %w", v.kind(), req.Key, ctx.Err())
		}
		if err != nil {
			cancel()
			return driver.Grant{}, err
		}
		pause := time.Duration(rand.Int64N(int64(min(2*time.Millisecond<<min(attempt, 6), 100*time.Millisecond)) + 1))
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-hints:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			cancel()
			return driver.Grant{}, fmt.Errorf("redisdriver: %s wait %q: %w", v.kind(), req.Key, ctx.Err())
		}
	}
}

// Renew resets owner's grant on key to a full ttl, measured by Redis. It
// returns driver.ErrLeaseLost when owner holds no grant of this lock.
func (v *rwView) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	d := v.d
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("redisdriver: %s renew: %w", v.kind(), err)
	}
	op := v.renewOp()
	s, err := d.session(op)
	if err != nil {
		return err
	}
	defer s.close()
	keys, _ := d.rwKeys(key)
	n, err := rwRenewScript.Run(ctx, s.c, keys, owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return storeErr(ctx, op, err)
	}
	if n != 1 {
		return fmt.Errorf("redisdriver: %s: %w", op, driver.ErrLeaseLost)
	}
	return d.replicated(ctx, s, op, "the renewal")
}

// Release removes owner's grant on key, atomically and only if owner holds
// it, and publishes a release hint when Options.ReleaseHints is set. It
// returns driver.ErrLeaseLost, having changed nothing, otherwise.
func (v *rwView) Release(ctx context.Context, key, owner string) error {
	d := v.d
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("redisdriver: %s release: %w", v.kind(), err)
	}
	keys, channel := d.rwKeys(key)
	if !d.hints {
		channel = ""
	}
	n, err := rwReleaseScript.Run(ctx, d.client, keys, owner, channel).Int64()
	if err != nil {
		return storeErr(ctx, v.kind()+" release", err)
	}
	if n != 1 {
		return fmt.Errorf("redisdriver: %s release: %w", v.kind(), driver.ErrLeaseLost)
	}
	return nil
}
