// Package redisdriver is the dlock driver for a single Redis deployment: one
// node (optionally with replicas), a Redis Cluster, or a client-side Ring,
// through github.com/redis/go-redis/v9. Import it for its side effect to open
// a store by URL:
//
//	import _ "github.com/dlock-dev/dlock/drivers/redisdriver"
//
//	locker, err := dlock.Open(ctx, "redis://:password@127.0.0.1:6379/0")
//
// The URL must name a host (an empty host is an error, never localhost);
// the port defaults to 6379 (see OpenURL).
//
// or construct it over a client you already have (the driver never closes a
// client it did not create):
//
//	locker := dlock.New(redisdriver.New(rdb, &redisdriver.Options{Prefix: "myapp:locks"}))
//
// # How it works
//
// Each operation is one Lua script, so it is atomic on the server:
//
//   - TryAcquire creates the lock hash only if it does not exist, with the
//     owner token, holder description and TTL, expiring after the TTL (the
//     SET NX PX pattern); only when it created the hash does it INCR the
//     fence counter of the key's hash slot and store the new value as the
//     grant's fence. A repeated attempt by the same owner token returns the
//     same grant.
//   - Renew resets the expiry (PEXPIRE) only while the hash still holds the
//     caller's owner token; otherwise it returns driver.ErrLeaseLost.
//   - Release deletes the hash only while it holds the caller's owner token
//     (never a bare DEL), then PUBLISHes a release hint; otherwise it
//     returns driver.ErrLeaseLost and changes nothing.
//
// A lock name K under the prefix P lives in the key "P:{K}:lock" (the hash),
// with '%', '{' and '}' percent-escaped in K and P, so any lock name
// (slashes, spaces, colons, braces, emoji, up to 512 bytes) maps to its own
// key, and the hash tag {K} decides its Redis Cluster slot.
//
// # Fence counters
//
// Fences come from a fixed set of shared counters, one per Redis Cluster
// hash slot (FenceCounters, 16384): the lock K draws its fences from the
// counter of slot(K), named "P:{T}:fences" where T is a short tag that
// Redis Cluster hashes to the same slot, so one script takes the lock and
// raises its counter on a single node or a cluster alike. A counter never
// expires and only ever grows, so the fences of every key are strictly
// increasing across releases and expiries, and the number of counter keys
// is bounded by 16384 (about 1.3 MB of memory; on a Ring, per shard) however
// many lock names are ever used. (A per-key counter with no expiry would
// leave one key per lock name forever, millions a year for a nightly
// per-merchant lock; a per-key counter that expired would let fences go
// back.) The price: the fences of keys that share a slot interleave (lock A
// may get 7 and lock B 8), so a key's fences grow faster than its own grant
// count and are not consecutive; a fence is only ever compared with other
// fences of the same key, so nothing else changes. The count is the slot
// count, not a smaller one, because a counter must share its lock's slot
// and lock names keep the layout of earlier versions (so clients of both
// versions exclude each other during an upgrade).
//
// Upgrading from the per-key counters "P:{K}:fence" of earlier versions:
// the acquire script, when the key's old counter exists, first raises the
// shared counter to max(old counter, shared counter), deletes the old
// counter, then INCRs the shared counter, all in one atomic script (the old
// counter has K's hash tag, so it is in the same slot). No fence ever goes
// back, and keys in use lose their old counters as they are next acquired.
// The old counters of keys that are not acquired again stay until an
// operator calls MigrateFenceCounters, which folds each remaining old
// counter into its shared counter and deletes it the same way; it is safe
// while clients acquire, and to run more than once.
//
// During a roll-out, clients of both versions exclude each other (the lock
// hash is where it always was), but their fences do not mix: once a new
// client has folded and deleted K's old counter, an old client acquiring K
// INCRs that counter from 1 again, so its fence is lower than fences
// already issued for K (a resource that checks fences refuses it with
// ErrStaleFence: safe, but the old client's work fails). Where fences
// matter, stop the old clients of a prefix before starting new ones, and
// run MigrateFenceCounters once no old client is left.
//
// # Capabilities
//
// The driver implements driver.Inspector (Inspect and List; Waiters counts
// the queue below), driver.Hinter (a
// subscription to the key's release channel "P:{K}:released", for readers
// that hold nothing) and driver.Waiter:
//
//   - Wait queues the waiter on Redis, in a list of owner tokens beside the
//     lock hash, once it has subscribed to the key's channel. Release, in
//     its one script, grants the key to the first live queued waiter (a
//     new fence; the grant expires after a short claim window until the
//     waiter claims it) and publishes that waiter's owner token on the
//     waiter's driver's own channel "P:wake:ID", so one release wakes one
//     waiter of one client, in FIFO order, and the hand-off needs no retry
//     race: no thundering herd.
//   - A lost wake-up (pub/sub is fire-and-forget; an expiry publishes
//     nothing; a crashed releaser releases nothing) costs latency, never
//     safety: each queued waiter also polls with full-jitter exponential
//     backoff (10 ms doubling to 500 ms), and each poll claims a hand-off
//     that was not announced, takes a key that expired, and keeps the
//     waiter's place. A waiter that crashed or left keeps the key from
//     others for at most the claim window (1 s), and is skipped once it
//     stops polling for 3 s. See wait.go for the details.
//   - With ReleaseHints off Wait queues nothing and only polls.
//
// Waiting is thus the driver's, not the root package's backoff polling
// (dlock.WithBackoff does not apply to it).
//
// It is a driver.SharedLocker for read-write locks (Shared with Limit 0 and
// Exclusive; no counted permits): owner-checked Lua over a hash of grants
// and a FIFO wait list, in keys of their own (see SharedView in shared.go).
// Those views are driver.Waiters, so that a waiting writer can hold back
// later readers.
//
// Loss: Redis cannot push loss (driver.Grant.Lost stays nil), but with
// release hints on, the holder's driver subscribes to the key's channel
// once it has held the grant for 100 ms (most grants of a busy lock end
// sooner, and would pay a SUBSCRIBE and an UNSUBSCRIBE for nothing) and
// passes a message there on as driver.Grant.Recheck, so that the root
// package renews at once. A force release (dlock release --force) of a
// grant held that long therefore ends the old holder's lease within a round
// trip, not at its next renewal (up to a third of the TTL later); in a
// grant's first 100 ms it is found by the next renewal. The message is only a hint: a forged or stale one costs one
// renewal, which succeeds, and the lease goes on. Expiry publishes
// nothing; it is found by renewal and the validity deadline. The
// subscription shares the driver's pub/sub connection, which stays open
// while the driver holds a grant.
//
// Resume: the driver is a driver.Resumer (dlock's Locker.Resume): a grant
// lives in its lock hash, not in a connection, so a restarted process
// re-attaches to it after one script checks owner token and fence.
//
// # What Redis cannot promise
//
// Redis gives a lock that is correct only while the one Redis primary that
// holds it keeps its data; the cases below break mutual exclusion or fence
// monotonicity, and no client-side code can repair them.
//
//   - Replication is asynchronous. A grant acknowledged by the primary may
//     not have reached a replica when the primary fails; the promoted
//     replica does not know the grant (a second client is granted the same
//     key while the first still works) and may not know the latest INCR of
//     the fence counter (the next fence repeats an earlier one).
//     Options.WaitReplicas (see Replicas and failover) narrows this to a
//     failover that promotes a replica that had not acknowledged; it does
//     not make Redis a consensus store. Use dlockd, etcd or ZooKeeper where
//     a failover must never grant twice.
//   - Fence counters are only as durable as the primary's persistence. With
//     no persistence (no AOF, no RDB) a restart forgets every counter and
//     fences start again at 1. With appendonly yes and appendfsync everysec
//     (the usual setting), a crash of the machine or a kill -9 can lose up to
//     one second of writes: the grants and INCRs of that second are
//     forgotten, so a fence may repeat. RDB snapshots alone lose everything
//     since the last snapshot. Only appendfsync always makes fences durable
//     on a single node (and slower). A clean shutdown (SHUTDOWN, SIGTERM)
//     writes everything.
//   - Redis expires keys by its own clock. The root package never compares
//     clocks across machines (validity runs on the client's monotonic
//     clock, minus a drift margin), but a Redis server whose clock jumps
//     forward (a manual change, a bad NTP step) expires grants early, while
//     their holders still believe they are valid. Run Redis with a clock
//     that is slewed, not stepped.
//   - Evictions: under maxmemory with an allkeys-* eviction policy, Redis may
//     evict a lock hash (a second grant) or a fence counter (repeated
//     fences, for every key of that slot). Use noeviction or a volatile-*
//     policy (counters have no TTL).
//
// Redlock (N independent masters and a majority, redlock://) is a separate
// driver with its own, different, assumptions.
//
// # Replicas and failover
//
// Options.WaitReplicas (wait_replicas=N in the URL) makes the driver send
// Redis's WAIT N T (https://redis.io/docs/latest/commands/wait/) after
// every script that grants or renews, on the same connection, and report
// the grant or renewal only once N replicas have acknowledged it: every
// grant and renewal a caller was told of is on at least N replicas (with
// every write the primary made before it, since replication is one ordered
// stream). So when the primary fails and one of those replicas is promoted,
// the new primary knows each grant it acknowledged, with the grant's fence
// and its fence counter at least that high: it does not grant that key
// again while the grant lasts, nor issue its fence again. A grant that
// fewer replicas acknowledged within T (WaitTimeout, 1 s by default, cut
// short of the call's deadline) is released and reported as
// driver.ErrUnavailable, so nobody works under a grant that a failover
// could forget; a renewal that too few acknowledged is
// driver.ErrUnavailable too, and the lease ends at its validity deadline
// unless a later renewal is acknowledged. A key handed over to a queued
// waiter by a release is reported when the waiter's claim has been
// acknowledged. An old primary cut off from its replicas (which may now
// follow a promoted one) cannot have its grants acknowledged, so it
// reports none: clients still talking to it get driver.ErrUnavailable,
// not a second grant.
//
// What it does not do:
//
//   - Redis's replication stays asynchronous for everything else, and
//     WAIT does not make Redis a consensus store: there is no quorum and
//     no election. A failover that promotes a replica that did not
//     acknowledge a grant (one that lagged, was chosen by hand or by a
//     replica-priority, or restarted without persistence since) still
//     loses it: a second grant of the key, a fence issued again. With N
//     below the number of replicas, the promoted replica must be the one
//     with the greatest replication offset (Redis Sentinel picks it, among
//     replicas of the same priority); with N equal to the number of
//     replicas any of them will do, but one replica down stops every grant.
//   - An acknowledgement means the replica received the write, not that
//     it wrote it to disk (WAITAOF does that; it is not used).
//   - Releases are not waited for: a release that a failover loses keeps
//     the key from others until the grant's TTL passes, on the new
//     primary's clock (which must agree with the old one's: Redis
//     replicates expiries as absolute times).
//   - It cannot count on a Redis Cluster or a Ring (the driver returns an
//     error matching driver.ErrInvalidArgument there: see
//     Options.WaitReplicas).
//
// The cost: one more round trip plus the replication latency per grant
// and renewal (the acquisition time is subtracted from a lease's
// validity, as always), a pooled connection held while WAIT blocks, and,
// with a replica down or lagging by more than WaitTimeout, no grants.
//
// # Timeouts
//
// Every call is bounded by its context. Clients opened by URL enable
// go-redis's ContextTimeoutEnabled and disable its command and dial retries
// (the root package decides what to retry). A client passed to New should set
// ContextTimeoutEnabled too; otherwise its ReadTimeout and WriteTimeout
// bound each call instead of the context's deadline.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the redis, redis-failover and redis-failover-wait sections of
// docs/GUARANTEES.md hold the figures, for one server, a primary with an
// asynchronous replica promoted under load (where double grants and
// reissued fences are expected, and measured), and the same with two
// replicas and wait_replicas=1 (the replica with the most of the stream
// promoted: no fence issued twice, no stale write accepted). make verify
// regenerates them.
package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/redislua"
	"github.com/dlock-dev/dlock/drivers/internal/redisrefuse"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// DefaultPrefix is the key prefix when Options.Prefix is empty.
const DefaultPrefix = "dlock"

func init() {
	open := func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return OpenURL(ctx, u)
	}
	driver.Register("redis", open)
	driver.Register("rediss", open)
}

// Client is the part of a go-redis client that the driver needs: running
// Lua scripts. *redis.Client, *redis.ClusterClient and *redis.Ring all
// implement it. Optional capabilities are found by type assertion: release
// hints need a Subscribe method, and List needs Scan (or ForEachMaster on a
// cluster, ForEachShard on a ring); without them Hint and List return an
// error matching errors.ErrUnsupported. Options.WaitReplicas needs a Conn
// method (*redis.Client); without it the calls that would wait return an
// error matching driver.ErrInvalidArgument.
type Client = redis.Scripter

// Options configures a Driver. A nil *Options is the same as the zero value.
type Options struct {
	// Prefix namespaces every Redis key and channel the driver uses, so lock
	// names never collide with an application's own keys, nor with other
	// dlock users sharing the database: a lock named K uses "Prefix:{K}:lock"
	// and its slot's fence counter "Prefix:{T}:fences". Drivers that share
	// locks must use the same prefix. Zero value: DefaultPrefix ("dlock").
	Prefix string

	// ReleaseHints makes Release and ForceRelease publish a hint on the
	// key's channel and makes the driver a working driver.Hinter, so
	// waiters retry as soon as the key is released, and a holder rechecks
	// its grant at once when it is force-released (Grant.Recheck). It needs PUBLISH and SUBSCRIBE rights and one
	// extra connection per driver while someone waits and for 30 s after
	// (on a Ring, one per waited-on key, closed when its wait ends). Zero
	// value: false, no hints (waiters poll with backoff only).
	// OpenURL turns it on unless the URL says hints=false.
	ReleaseHints bool

	// WaitReplicas, when above 0, reports a grant or a renewal to the
	// caller only once at least that many replicas have acknowledged it
	// (Redis's WAIT, sent on the connection that ran the script): in
	// TryAcquire, Wait (a key found free, or handed over by a release and
	// claimed), Renew, Resume and the read-write views (SharedView). A
	// grant that fewer replicas acknowledged within WaitTimeout is
	// released (owner-checked, best effort) and the call returns an error
	// matching driver.ErrUnavailable that says "replicated to k of N
	// replicas within T"; a renewal or resumption that too few
	// acknowledged returns such an error too (never driver.ErrLeaseLost:
	// the lease's heartbeat retries until its validity ends), and leaves
	// the grant held. Release
	// does not wait. It costs one more round trip plus the replication
	// latency per grant and renewal, and holds a pooled connection while
	// WAIT blocks. It needs a single-node *redis.Client (redis.NewClient,
	// or redis.NewFailoverClient for Sentinel; any Client with a method
	// Conn() *redis.Conn): over a ClusterClient, a Ring or another Client
	// those calls, and a negative value with any client, return an error
	// matching driver.ErrInvalidArgument before anything is sent. See
	// "Replicas and failover" in the package doc for what it does and does
	// not guarantee. Zero value: 0, no waiting (one round trip per call).
	WaitReplicas int

	// WaitTimeout bounds how long one WAIT blocks, rounded up to whole
	// milliseconds (WAIT counts in milliseconds, and its 0 would block
	// forever: it is never sent). Redis may answer a WAIT up to 1/hz late
	// (100 ms at its default hz 10), so each WAIT is also cut short of the
	// call's context deadline by 100 ms plus a tenth of the time left (at
	// most half the time left), kept for that, the reply and the release
	// of a grant that fell short. Ignored when WaitReplicas is 0;
	// otherwise a negative value makes the calls that wait return an
	// error matching driver.ErrInvalidArgument. Zero value:
	// DefaultWaitTimeout (1 s).
	WaitTimeout time.Duration
}

// Driver is a dlock driver over one Redis deployment. It is safe for
// concurrent use.
type Driver struct {
	client Client
	ns     string // escaped prefix
	hints  bool
	hub    *hub         // nil when hints are off or the client cannot subscribe
	closer func() error // closes an owned client; nil otherwise
	addr   string       // host:port when opened by URL, for errors
	wakeID string       // random; names the driver's wake channel (wait.go)
	closed atomic.Bool
	repl   replicaWait // Options.WaitReplicas (replicas.go)

	keyCache sync.Map // key -> *keySet (lockKeys)
	keyCount atomic.Int64

	watchMu sync.Mutex
	watches map[grantID]*grantWatch // recheck subscriptions of held grants
	pending []*grantWatch           // watches not yet subscribed, oldest first
	sweep   *time.Timer             // starts the pending watches; nil when none
	watchWG sync.WaitGroup
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Hinter    = (*Driver)(nil)
)

// New returns a driver over client, which it uses but never closes. opts may
// be nil. It does not contact Redis.
func New(client Client, opts *Options) *Driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	d := &Driver{client: client, ns: escape(o.Prefix), hints: o.ReleaseHints, watches: map[grantID]*grantWatch{}, wakeID: randomID(),
		repl: newReplicaWait(client, o)}
	if sub, ok := client.(subscriber); ok && o.ReleaseHints {
		_, ring := client.(*redis.Ring)
		d.hub = newHub(sub, ring)
	}
	return d
}

// Open opens a driver on the Redis server named by rawURL, as OpenURL does.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, urlparam.Wrap("redisdriver: parse URL", err)
	}
	return OpenURL(ctx, u)
}

// OpenURL opens a driver on the Redis server named by u and PINGs it, so an
// unreachable server fails at once (the error matches
// driver.ErrUnavailable). The driver owns its client: Close closes it.
//
// The URL is redis://[user:password@]host:port[/db] or rediss://… for TLS,
// with go-redis's query options (dial_timeout, pool_size, …; see
// redis.ParseURL) and the driver's: prefix=P sets Options.Prefix,
// hints=false turns Options.ReleaseHints off (it is on by default here),
// wait_replicas=N sets Options.WaitReplicas (a non-negative integer; 0, the
// default, is off) and wait_timeout=D sets Options.WaitTimeout (a positive
// Go duration, e.g. 500ms; default 1s). For example
// redis://10.0.0.5:6379?wait_replicas=1&wait_timeout=250ms reports a grant
// or a renewal only once one replica has it (see "Replicas and failover").
// Command retries are off unless max_retries is given, a failed dial is not
// retried within a call, and the context's deadline bounds every call.
//
// The host must be given: an empty host (redis://, redis://:6379) is an
// invalid URL, never go-redis's default of localhost, so that
// redis://$LOCKHOST:6379 with LOCKHOST unset cannot make every machine lock
// against a Redis of its own. The port may be left out and is then 6379,
// Redis's well-known port (redis://host); "host:" with an empty port is
// invalid.
//
// An invalid URL (another scheme, an empty host or port, a port outside 1..65535, a bad database
// number, an unknown or malformed parameter) and a server that refuses the
// URL's credentials or database number return an error matching
// driver.ErrInvalidArgument, never driver.ErrUnavailable.
func OpenURL(ctx context.Context, u *url.URL) (*Driver, error) {
	opts := Options{ReleaseHints: true}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, urlparam.Invalid("redisdriver: URL scheme %q, want redis or rediss", u.Scheme)
	}
	if err := urlparam.Addrs("redisdriver", u.Host, u.Scheme+"://HOST[:PORT][/DB]", false); err != nil {
		return nil, err
	}
	cu := *u
	q := cu.Query()
	if q.Has("prefix") {
		opts.Prefix = q.Get("prefix")
		q.Del("prefix")
	}
	if q.Has("hints") {
		on, err := strconv.ParseBool(q.Get("hints"))
		if err != nil {
			return nil, urlparam.Invalid("redisdriver: URL option hints=%q is not a boolean", q.Get("hints"))
		}
		opts.ReleaseHints = on
		q.Del("hints")
	}
	if err := parseReplicaWait(q, &opts); err != nil {
		return nil, err
	}
	cu.RawQuery = q.Encode()
	ro, err := redis.ParseURL(cu.String())
	if err != nil {
		return nil, urlparam.Wrap("redisdriver", err)
	}
	if ro.DB < 0 {
		return nil, urlparam.Invalid("redisdriver: database number %d is negative", ro.DB)
	}
	// One attempt per call, dial included: the root package decides what to
	// retry, with its own backoff.
	if ro.MaxRetries == 0 {
		ro.MaxRetries = -1
	}
	ro.DialerRetries = 1
	ro.ContextTimeoutEnabled = true
	client := redis.NewClient(ro)
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		if refused(err) {
			return nil, urlparam.Wrap("redisdriver: redis at "+ro.Addr+" refused the connection's settings", err)
		}
		if notRedis(err) {
			return nil, urlparam.Wrap("redisdriver: the server at "+ro.Addr+" does not speak the Redis protocol (is it Redis?); check the URL's port", err)
		}
		return nil, fmt.Errorf("redisdriver: ping %s: %w: %w", ro.Addr, driver.ErrUnavailable, err)
	}
	d := New(client, &opts)
	d.closer = client.Close
	d.addr = ro.Addr
	return d, nil
}

// The scripts. KEYS[1] is the lock hash; for acquire, KEYS[2] is the shared
// fence counter of its slot and KEYS[3] its legacy per-key counter. All the
// keys of one call are in one Cluster slot.
var (
	// ARGV: owner, ttl in ms, holder. Returns the fence, or 0 when held.
	// A legacy counter is folded into the shared one (max) and deleted
	// before the INCR, so no fence goes back after an upgrade.
	acquireScript = redis.NewScript(redislua.NextFence + `
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur then
  if cur == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
    return tonumber(redis.call('HGET', KEYS[1], 'fence'))
  end
  return 0
end
local fence = nextFence()
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, 'holder', ARGV[3], 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
`)
	// ARGV: owner, ttl in ms. Returns 1, or 0 when not the owner.
	renewScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
  return 1
end
return 0
`)
	// KEYS: lock, shared counter, legacy counter, queue, waiting
	// (lockKeys). ARGV: owner, hint channel or "", claim window in ms.
	// Only while owner holds the lock, deletes the grant and, when the
	// grant's hash says that waiters queued behind it (field q, set by the
	// wait script), hands the key to the first live queued waiter (a new
	// fence, the waiter's owner, holder and TTL, expiring after the claim
	// window until claimed; see wait.go), publishing "grant:" and its
	// owner token on the waiter's wake channel (and "released" on the
	// key's channel, for readers of hints: Hint); with nobody to hand to,
	// publishes "released". When owner does not hold the lock, removes
	// owner's queue entry, if any (a waiter leaving). With a fourth
	// argument, a fence, it is a force release (admin.go): the grant with
	// that fence is removed whoever owns it (owner is ignored) and the key
	// is handed on as by its owner's release. Returns 1, or 0 when not the
	// owner (or, forced, when the grant's fence changed).
	releaseScript = redis.NewScript(redislua.NextFence + `
local v = redis.call('HMGET', KEYS[1], 'owner', 'q', 'fence')
if ARGV[4] then
  if v[3] ~= ARGV[4] then
    return 0
  end
elseif v[1] ~= ARGV[1] then
  redis.call('HDEL', KEYS[5], ARGV[1])
  return 0
end
redis.call('DEL', KEYS[1])
local now
while v[2] do
  local w = redis.call('LPOP', KEYS[4])
  if not w then
    break
  end
  local e = redis.call('HGET', KEYS[5], w)
  if e then
    redis.call('HDEL', KEYS[5], w)
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local a = string.find(e, ' ', 1, true)
    local b = string.find(e, ' ', a + 1, true)
    local c = string.find(e, ' ', b + 1, true)
    if tonumber(string.sub(e, 1, a - 1)) >= now then
      local ttl = string.sub(e, a + 1, b - 1)
      local n = tonumber(string.sub(e, b + 1, c - 1))
      local wake = string.sub(e, c + 1, c + n)
      local fence = nextFence()
      redis.call('HSET', KEYS[1], 'owner', w, 'fence', fence, 'holder', string.sub(e, c + n + 1), 'ttl', ttl)
      if redis.call('LLEN', KEYS[4]) > 0 then
        redis.call('HSET', KEYS[1], 'q', '1')
      end
      redis.call('PEXPIRE', KEYS[1], math.min(tonumber(ttl), tonumber(ARGV[3])))
      if ARGV[2] ~= '' then
        redis.call('PUBLISH', wake, 'grant:' .. w)
        if wake ~= ARGV[2] then
          redis.call('PUBLISH', ARGV[2], 'released')
        end
      end
      return 1
    end
  end
end
if ARGV[2] ~= '' then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
`)
	// KEYS[1] is a legacy per-key counter, KEYS[2] the shared counter of
	// its slot. Folds the first into the second (max) and deletes it.
	// Returns 1, or 0 when the legacy counter was already gone.
	foldScript = redis.NewScript(`
local old = redis.call('GET', KEYS[1])
if not old then
  return 0
end
if tonumber(old) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], old)
end
redis.call('DEL', KEYS[1])
return 1
`)
	// KEYS: lock, waiting. Returns nil when free, else {fence, holder,
	// ttl ms, pttl ms, queued waiters}.
	inspectScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'holder', 'ttl')
if not v[1] then
  return false
end
return {v[2] or '0', v[3] or '', v[4] or '0', redis.call('PTTL', KEYS[1]), redis.call('HLEN', KEYS[2])}
`)
)

// TryAcquire makes one acquisition attempt. It returns the grant with a
// fence greater than every fence issued earlier for req.Key (subject to the
// package's durability caveats), driver.ErrNotAcquired when another owner
// holds the key, or the store's error wrapped. With Options.WaitReplicas,
// a grant that too few replicas acknowledged in time is released and
// returned as an error matching driver.ErrUnavailable.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := d.checkOpen(); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redisdriver: acquire: %w", err)
	}
	s, err := d.session("acquire")
	if err != nil {
		return driver.Grant{}, err
	}
	defer s.close()
	keys, _ := d.lockKeys(req.Key)
	n, err := acquireScript.Run(ctx, s.c, keys[:3], req.Owner, req.TTL.Milliseconds(), req.Holder).Int64()
	if err != nil {
		return driver.Grant{}, storeErr(ctx, "acquire", err)
	}
	if n <= 0 {
		return driver.Grant{}, driver.ErrNotAcquired
	}
	if err := d.replicated(ctx, s, "acquire", "the grant"); err != nil {
		return driver.Grant{}, d.dropLock(ctx, &s, err, req.Key, req.Owner)
	}
	return driver.Grant{Fence: uint64(n), Recheck: d.watch(req.Key, req.Owner, req.TTL)}, nil
}

// Renew resets the expiry of owner's grant on key to ttl (rounded down to
// milliseconds), measured by Redis. It returns driver.ErrLeaseLost when
// owner no longer holds key, an error matching driver.ErrUnavailable when
// fewer than Options.WaitReplicas replicas acknowledged the renewal in
// time (the grant stays held), or the store's error wrapped.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("redisdriver: renew: %w", err)
	}
	s, err := d.session("renew")
	if err != nil {
		return err
	}
	defer s.close()
	keys, _ := d.lockKeys(key)
	n, err := renewScript.Run(ctx, s.c, keys[:1], owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return storeErr(ctx, "renew", err)
	}
	if n != 1 {
		d.unwatch(key, owner)
		return driver.ErrLeaseLost
	}
	// The primary has the new expiry, confirmed on replicas or not: the
	// recheck watch follows it.
	d.renewed(key, owner, ttl)
	return d.replicated(ctx, s, "renew", "the renewal")
}

// Release deletes owner's grant on key, atomically and only if owner still
// holds it, and publishes a release hint when Options.ReleaseHints is set.
// It returns driver.ErrLeaseLost, having changed nothing, when owner does
// not hold key, or the store's error wrapped.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("redisdriver: release: %w", err)
	}
	// The grant's own recheck subscription ends first: the release hint
	// published below is for waiters, not for this holder.
	d.unwatch(key, owner)
	keys, channel := d.lockKeys(key)
	if !d.hints {
		channel = ""
	}
	n, err := releaseScript.Run(ctx, d.client, keys, owner, channel, handoffClaimMs).Int64()
	if err != nil {
		return storeErr(ctx, "release", err)
	}
	if n != 1 {
		return driver.ErrLeaseLost
	}
	return nil
}

// Hint subscribes to release hints for key (see driver.Hinter). It waits,
// at most 500 ms and never past ctx, until Redis confirms the subscription,
// so a release published after Hint returns is normally seen. The caller
// must call stop. It returns an error matching errors.ErrUnsupported when
// Options.ReleaseHints is off or the client cannot subscribe, and
// driver.ErrClosed after Close.
func (d *Driver) Hint(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := d.checkOpen(); err != nil {
		return nil, nil, err
	}
	if err := driver.CheckKey(key); err != nil {
		return nil, nil, fmt.Errorf("redisdriver: hint: %w", err)
	}
	if d.hub == nil {
		return nil, nil, fmt.Errorf("redisdriver: release hints are off or the client cannot subscribe: %w", errors.ErrUnsupported)
	}
	_, _, channel := d.keys(key)
	return d.hub.subscribe(ctx, channel)
}

// Inspect returns the current grant of key: its fence, holder description,
// TTL, the time Redis says is left (PTTL, in milliseconds) and the number of
// waiters queued by Wait (including, until a release skips them, waiters
// that crashed within the last few seconds). It returns an error matching driver.ErrNotAcquired
// when the key is free, or the store's error wrapped.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := d.checkOpen(); err != nil {
		return driver.HolderInfo{}, err
	}
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("redisdriver: inspect: %w", err)
	}
	return d.inspect(ctx, d.client, key)
}

func (d *Driver) inspect(ctx context.Context, c Client, key string) (driver.HolderInfo, error) {
	keys, _ := d.lockKeys(key)
	res, err := inspectScript.Run(ctx, c, []string{keys[0], keys[4]}).Slice()
	if errors.Is(err, redis.Nil) {
		return driver.HolderInfo{}, fmt.Errorf("redisdriver: inspect: %w", driver.ErrNotAcquired)
	}
	if err != nil {
		return driver.HolderInfo{}, storeErr(ctx, "inspect", err)
	}
	if len(res) != 5 {
		return driver.HolderInfo{}, fmt.Errorf("redisdriver: inspect: unexpected reply %v", res)
	}
	info := driver.HolderInfo{Key: key}
	if n, ok := res[4].(int64); ok {
		info.Waiters = int(n)
	}
	info.Fence, _ = strconv.ParseUint(fmt.Sprint(res[0]), 10, 64)
	info.Holder = fmt.Sprint(res[1])
	if ms, err := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64); err == nil {
		info.TTL = time.Duration(ms) * time.Millisecond
	}
	if ms, ok := res[3].(int64); ok && ms > 0 {
		info.Remaining = time.Duration(ms) * time.Millisecond
	}
	return info, nil
}

// scanner is the SCAN command of a single-node client.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// List returns the held keys that start with prefix (a plain string, not a
// pattern), sorted by key, found by SCAN over the driver's namespace (every
// master of a cluster, every shard of a ring). Like SCAN, it sees a moving
// keyspace: a lock granted or released during the call may or may not be
// listed. It returns an error matching errors.ErrUnsupported when the client
// cannot scan, or the store's error wrapped.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	var (
		mu    sync.Mutex
		infos = map[string]driver.HolderInfo{}
	)
	scanOne := func(ctx context.Context, s scanner, c Client) error {
		return d.scan(ctx, s, c, prefix, func(info driver.HolderInfo) {
			mu.Lock()
			infos[info.Key] = info
			mu.Unlock()
		})
	}
	if err := d.forEachNode(ctx, "list", scanOne); err != nil {
		return nil, err
	}
	out := make([]driver.HolderInfo, 0, len(infos))
	for _, info := range infos {
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// forEachNode runs fn on every master of a cluster, every shard of a ring,
// or the one node of a single-node client, with that node's SCAN and a
// client that runs scripts there. op names the operation in errors.
func (d *Driver) forEachNode(ctx context.Context, op string, fn func(context.Context, scanner, Client) error) error {
	node := func(ctx context.Context, c *redis.Client) error { return fn(ctx, c, c) }
	var err error
	switch c := d.client.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachMaster(ctx, node)
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachShard(ctx, node)
	case scanner:
		err = fn(ctx, c, d.client)
	default:
		return fmt.Errorf("redisdriver: %s: the client cannot SCAN: %w", op, errors.ErrUnsupported)
	}
	if err != nil {
		return storeErr(ctx, op, err)
	}
	return nil
}

// MigrateFenceCounters folds every legacy per-key fence counter
// ("P:{K}:fence", written by versions before the shared counters; see
// "Fence counters" in the package doc) into the shared counter of its slot,
// raising that counter to the larger of the two, and deletes it: one atomic
// script per counter, found by SCAN over the driver's namespace (every
// master of a cluster, every shard of a ring). Fences of every key keep
// increasing. It is an operator's one-off clean-up, safe to run while
// clients acquire and to run again (it then finds nothing), but run it only
// once every client of the prefix runs a version with shared counters: an
// older client restarts a deleted per-key counter from 1. It returns the
// number of counters folded, an error matching errors.ErrUnsupported when
// the client cannot SCAN, driver.ErrClosed after Close, or the store's
// error wrapped (the count then says how many were folded before it).
func (d *Driver) MigrateFenceCounters(ctx context.Context) (int, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	var folded atomic.Int64
	err := d.forEachNode(ctx, "migrate fence counters", func(ctx context.Context, s scanner, c Client) error {
		var cursor uint64
		for {
			keys, next, err := s.Scan(ctx, cursor, d.legacyFencePattern(), 1000).Result()
			if err != nil {
				return err
			}
			for _, rk := range keys {
				key, ok := d.keyOf(rk, legacyFenceSuffix)
				if !ok {
					continue
				}
				_, shared, _ := d.keys(key)
				n, err := foldScript.Run(ctx, c, []string{rk, shared}).Int64()
				if err != nil {
					return err
				}
				folded.Add(n)
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
	return int(folded.Load()), err
}

// scan lists the lock hashes of one node with s, inspecting each with c.
func (d *Driver) scan(ctx context.Context, s scanner, c Client, prefix string, add func(driver.HolderInfo)) error {
	pattern := d.lockPattern(prefix)
	var cursor uint64
	for {
		keys, next, err := s.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		for _, rk := range keys {
			key, ok := d.keyOfLock(rk)
			if !ok || !strings.HasPrefix(key, prefix) {
				continue
			}
			info, err := d.inspect(ctx, c, key)
			if errors.Is(err, driver.ErrNotAcquired) {
				continue // released or expired since SCAN saw it
			}
			if err != nil {
				return err
			}
			add(info)
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// Close ends the driver's hint subscriptions and, when the driver was opened
// by URL, closes its client. It does not release grants: Redis expires
// them. Calls after Close return driver.ErrClosed; closing twice returns
// nil.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.stopWatches()
	if d.hub != nil {
		d.hub.close()
	}
	if d.closer != nil {
		return d.closer()
	}
	return nil
}

// storeErr wraps a store error of op. When ctx has ended, or its deadline
// has passed (the socket deadline that go-redis derives from it can fire
// before the context's own timer), the error also matches the context's
// error, so callers see why the call stopped.
//
// A reply in which Redis refused the request itself (see refused) matches
// driver.ErrInvalidArgument instead: retrying cannot help, and it must
// never pass for an outage. So does an answer that is not Redis's protocol
// (see notRedis).
func storeErr(ctx context.Context, op string, err error) error {
	if refused(err) {
		return urlparam.Wrap("redisdriver: "+op+": redis refused the request", err)
	}
	if notRedis(err) {
		return urlparam.Wrap("redisdriver: "+op+": the server does not speak the Redis protocol (is it Redis?); check the URL's port", err)
	}
	cerr := ctx.Err()
	if cerr == nil {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			cerr = context.DeadlineExceeded
		}
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("redisdriver: %s: %w (%w)", op, cerr, err)
	}
	return fmt.Errorf("redisdriver: %s: %w", op, err)
}

// refused reports whether err is a Redis error reply that refuses the
// request as invalid (redisrefuse.Refused).
func refused(err error) bool { return redisrefuse.Refused(err) }

func (d *Driver) checkOpen() error {
	if d.closed.Load() {
		return fmt.Errorf("redisdriver: %w", driver.ErrClosed)
	}
	return nil
}

// notRedis reports whether err says the peer answered but does not speak
// Redis's protocol (redisrefuse.NotRedis): a configuration error that the
// driver reports as driver.ErrInvalidArgument, never as an outage.
func notRedis(err error) bool { return redisrefuse.NotRedis(err) }
