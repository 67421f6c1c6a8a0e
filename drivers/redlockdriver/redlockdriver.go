// Package redlockdriver is the dlock driver for Redlock: one lock over N
// independent Redis masters (N ≥ 3, usually 5), granted when a majority of
// them agree, using github.com/redis/go-redis/v9.
//
// Open it by URL with dlock.Open (scheme "redlock", registered in init):
//
//	redlock://[:password@]host:port,host:port,host:port[,…][?node_timeout=50ms&db=0&prefix=P]
//
// Every node names its host and port (an empty host or port, or a node
// without a port, is an error at Open, never a default). Or construct it
// directly with New over clients you already have.
//
// # The algorithm
//
// This is Redlock as described in the Redis documentation ("Distributed
// Locks with Redis"). An acquisition sends, to every node in parallel and
// each bounded by the node timeout, a script that sets the lock key to the
// owner token with the TTL if it is absent. It succeeds when a majority
// (N/2+1) of the nodes set it and the time spent is well inside the TTL:
// the whole attempt must finish within half the TTL, and the validity left,
// TTL − time spent − drift, must be positive; otherwise the key is released
// on every node and the attempt fails. The dlock root package computes the
// same validity on its own (sent + TTL − drift, with sent the moment the
// attempt started), so the time spent acquiring is subtracted.
//
// Renew extends the key on every node where it still holds the owner token
// (PEXPIRE) and succeeds when a majority of the nodes was found holding it.
// A node where the key is missing (evicted, deleted, FLUSHALL, restarted
// empty, failed over to a replica without it) is evidence that the lease
// may have been taken: between the key's disappearance and this renewal
// another client may have counted that node toward a majority of its own,
// worked and released. So a missing key never counts toward the majority.
// When too many nodes answer "missing" or "held by another owner" for a
// majority to remain, the lease is lost at once (driver.ErrLeaseLost) and
// the driver removes what it still holds; nodes that do not answer are
// evidence neither way (driver.ErrUnavailable, and the root package's
// validity deadline decides). Only after a renewal has found a majority are
// the missing nodes repaired (the key set again, only if absent, with the
// same owner token and the grant's fence), in a second round, so that the
// next renewal may count them: a key re-created at a moment when the owner
// still held a majority cannot hide another holder. Release deletes the key
// on every node where it still holds the owner token. Renew and Release
// report per-node results in a *QuorumError (its Unwrap() []error lists
// each node's error), and one node's error does not lose a lease that
// still has a majority.
//
// # Fencing
//
// Each node also keeps FenceCounters (1024) shared fence counters, and a
// key draws its fences from counter number FNV-1a(key) mod 1024 on every
// node. An acquisition raises that counter by one on each node where it
// sets the lock key (in the same script, so atomically with taking the key
// there) and takes F, the highest counter of its majority. F must then be
// on a majority: when a majority of the nodes it locked already reached F
// (the usual case, their counters were equal) it is; otherwise a second
// round writes F to every node with a "set if greater" script that only
// writes while the node still holds the owner token, and F is the grant's
// fence only when a majority took it.
//
// Why that is monotonic: grant G1 put F1 on a majority M1, on each node
// while holding its key there. A later grant G2 took the key on a majority
// M2, on each node only after G1's key was gone from it. M1 and M2
// intersect (two majorities of one N always do), and on a node n in both,
// G1's write happened before G1's key left n, which is before G2 took n and
// raised its counter. So G2 raises that counter above F1, and its fence, the
// highest counter of M2, is greater than F1. Renewals write the grant's
// fence to a repaired node as well. Sharing a counter changes nothing in
// this argument, because a counter only ever grows: other keys' grants can
// only raise it.
//
// The argument breaks when a node forgets its counters: a node restarting
// empty (no persistence, or AOF with appendfsync everysec losing its last
// second), or evicting a counter, may be the only node of an intersection,
// and the next grant then reads a smaller maximum. Run the nodes with
// appendonly yes and appendfsync always if the fence must hold across
// crashes, and with noeviction or a volatile-* maxmemory policy; with fewer
// guarantees the fence is only as monotonic as the counters are durable.
// Counters above 2^53 lose precision in Lua.
//
// The shared counters bound what the fences leave behind: at most 1024
// keys per node, however many lock names are ever used (one counter per
// name, never expiring, would leave one key per name on every node
// forever; counters that expired would let fences go back). The price: the
// fences of keys that share a counter interleave, so a key's fences grow
// faster than its own grant count and are not consecutive; a fence is only
// ever compared with other fences of the same key. The count is fixed:
// every client must map a key to the same counter.
//
// Upgrading from the per-key counters "Prefix fence:K" of earlier
// versions: the acquisition script, on each node where it takes the key and
// finds the key's old counter, first raises the shared counter to
// max(old counter, shared counter) and deletes the old counter, then
// raises the shared counter, atomically; so no fence goes back (the old
// grant's fence was on a majority of old counters, which the new majority
// meets). Old counters of keys that are not acquired again stay until an
// operator calls MigrateFenceCounters, which folds and deletes them the same
// way on every node. During a roll-out, clients of both versions exclude
// each other (the lock keys are unchanged), but an old client acquiring a
// key whose old counters were deleted draws fences from 1 again, lower
// than fences already issued (a resource that checks fences refuses them):
// where fences matter, stop the old clients before starting new ones.
//
// # Restarts
//
// A node that restarts empty forgets the keys it held (as do an eviction,
// a FLUSHALL or a failover to a replica without the key), so another
// client can count it towards a majority of its own while this grant still
// believes it holds: two holders, until this grant's next renewal finds
// the key missing on too many nodes and reports the loss
// (driver.ErrLeaseLost; the root package cancels the lease's context). The
// renewal bounds how long the two overlap (one heartbeat interval, TTL/3
// by default, plus the renewal's round trip); it cannot prevent it. As the Redis documentation says, run
// the nodes with persistence (appendonly yes, appendfsync always) or keep
// a crashed node down for longer than the longest TTL in use before it
// rejoins (delayed restart).
//
// # Timing assumptions, and when not to use it
//
// Redlock's safety rests on timing: it assumes clocks on the nodes and the
// client advance at about the same rate (drift bounded by the drift margin,
// 1% of the TTL + 2 ms by default), that a node does not expire keys early
// (no clock jumps on the servers), and that the client is not paused (GC,
// swap, SIGSTOP, a long network delay) for longer than the validity it has
// left. Martin Kleppmann's critique ("How to do distributed locking", 2016)
// shows that a pause or a clock jump lets two clients believe they hold the
// lock; a lock without a fence checked by the resource cannot be made safe
// against that. Use Redlock for efficiency (avoid doing work twice) or
// together with the fence enforced at the resource. Where correctness
// matters and a consensus store is available, prefer dlockd, etcd or
// ZooKeeper, whose grants do not depend on timing.
//
// # Capabilities
//
// No Waiter (Acquire polls with the root package's full-jitter backoff), no
// pushed loss (Grant.Lost is nil), no Inspector. It is a driver.Resumer
// (dlock's Locker.Resume): the lock keys outlive the process that set them,
// so a restarted one re-attaches to its grant on a majority (Driver.Resume
// says how the fence is checked).
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the redlock sections of docs/GUARANTEES.md hold the figures, for
// five servers, each behind a proxy. make verify regenerates them.
package redlockdriver

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/redislua"
	"github.com/dlock-dev/dlock/drivers/internal/redisrefuse"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("redlock", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return Open(ctx, u)
	})
}

// MinNodes is the smallest number of nodes New and Open accept.
const MinNodes = 3

// FenceCounters is the number of shared fence counters on each node: a key
// draws its fences from counter FNV-1a(key) mod FenceCounters, named
// "Prefix fences:N" (see "Fencing" in the package doc).
const FenceCounters = 1024

// Options configure a Driver. A nil *Options selects every default.
type Options struct {
	// Prefix starts every Redis key the driver writes. Zero value:
	// "dlock:redlock:".
	Prefix string
	// NodeTimeout bounds each attempt on one node (acquire, fence write,
	// renew, release); an acquisition makes two rounds, and must end within
	// half the TTL. Zero value: the TTL / 10, between 10 ms and 1 s; for
	// Release, which gets no TTL, 1 s.
	NodeTimeout time.Duration
	// Names names the nodes in errors, index by index. Zero value:
	// "node0", "node1", ...
	Names []string
}

// Driver is a Redlock driver over N independent Redis masters. It is safe
// for concurrent use.
type Driver struct {
	nodes   []redis.Scripter
	names   []string
	closers []func() error
	quorum  int
	prefix  string
	nodeTO  time.Duration // 0: derived from the TTL

	mu     sync.Mutex
	closed bool
	fences map[string]fenceOf // key + "\x00" + owner → fence, for repairs
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over clients, one per independent Redis master (at
// least MinNodes). It never closes the clients. opts may be nil.
func New(clients []redis.Scripter, opts *Options) (*Driver, error) {
	if len(clients) < MinNodes {
		return nil, urlparam.Invalid("redlockdriver: %d nodes, need at least %d", len(clients), MinNodes)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "dlock:redlock:"
	}
	names := make([]string, len(clients))
	for i := range names {
		if i < len(o.Names) && o.Names[i] != "" {
			names[i] = o.Names[i]
		} else {
			names[i] = "node" + strconv.Itoa(i)
		}
	}
	return &Driver{
		nodes: clients, names: names, quorum: len(clients)/2 + 1,
		prefix: o.Prefix, nodeTO: o.NodeTimeout, fences: map[string]fenceOf{},
	}, nil
}

// MaxURLPrefixBytes is the longest value of Open's URL parameter prefix.
const MaxURLPrefixBytes = 256

// urlPrefix checks the values of the URL parameter prefix and returns the
// one value, or an error matching driver.ErrInvalidArgument.
func urlPrefix(vs []string) (string, error) {
	if len(vs) != 1 {
		return "", urlparam.Invalid("redlockdriver: URL parameter prefix is given %d times; give it once", len(vs))
	}
	p := vs[0]
	if p == "" || len(p) > MaxURLPrefixBytes {
		return "", urlparam.Invalid("redlockdriver: URL parameter prefix=%q must be 1 to %d bytes", p, MaxURLPrefixBytes)
	}
	for _, r := range p {
		if !utf8.ValidString(p) || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return "", urlparam.Invalid("redlockdriver: URL parameter prefix=%q has a space, control or invalid character", p)
		}
	}
	return p, nil
}

// Open connects to the nodes named by u,
// redlock://[:password@]h1:p1,h2:p2,h3:p3[,…], with the optional query
// parameters node_timeout (a Go duration), db and prefix. prefix=P sets
// Options.Prefix to "P:", so every key the driver writes on each node (lock
// keys "P:lock:K", fence counters "P:fences:N") starts with "P:" and
// drivers with different prefixes are independent; P must be 1 to
// MaxURLPrefixBytes bytes of printable characters (no space or control
// character). Without it the prefix is "dlock:redlock:". The driver owns
// the clients and closes them in Close. Every node must name its host and
// port: there is no default for either. An invalid URL (another scheme,
// fewer than MinNodes hosts, an empty node, host or port, a missing port,
// a port outside 1..65535, an unknown or
// malformed parameter) and nodes that refuse its credentials or database number
// (enough of them that no majority is possible) return an error matching
// driver.ErrInvalidArgument.
func Open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != "redlock" {
		return nil, urlparam.Invalid("redlockdriver: URL scheme %q, want redlock", u.Scheme)
	}
	if err := urlparam.Addrs("redlockdriver", u.Host, "redlock://HOST:PORT,HOST:PORT,HOST:PORT", true); err != nil {
		return nil, err
	}
	q := u.Query()
	if err := urlparam.Known("redlockdriver", q, "node_timeout", "db", "prefix"); err != nil {
		return nil, err
	}
	var o Options
	if q.Has("prefix") {
		p, err := urlPrefix(q["prefix"])
		if err != nil {
			return nil, err
		}
		o.Prefix = p + ":"
	}
	if err := urlparam.Durations(q, map[string]*time.Duration{"node_timeout": &o.NodeTimeout}); err != nil {
		return nil, urlparam.Wrap("redlockdriver", err)
	}
	db := 0
	if v := q.Get("db"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, urlparam.Invalid("redlockdriver: URL parameter db=%q is not a database number (0 or more)", v)
		}
		db = n
	}
	var user, pass string
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	var clients []redis.Scripter
	var closers []func() error
	for _, h := range urlparam.Hosts(u.Host) {
		c := redis.NewClient(&redis.Options{
			Addr: h, Username: user, Password: pass, DB: db,
			MaxRetries:            -1, // the driver never retries
			DialTimeout:           time.Second,
			ContextTimeoutEnabled: true,
			PoolSize:              32,
			DisableIdentity:       true,
		})
		clients = append(clients, c)
		closers = append(closers, c.Close)
		o.Names = append(o.Names, h)
	}
	d, err := New(clients, &o)
	if err != nil {
		for _, c := range closers {
			_ = c()
		}
		return nil, err
	}
	d.closers = closers
	// Warm each node's pool (dial and handshake) so that the first
	// acquisition is not spent connecting; a node that is down now is not
	// an error.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	errs := d.each(wctx, time.Second, func(ctx context.Context, i int, c redis.Scripter) error {
		if p, ok := c.(interface {
			Ping(context.Context) *redis.StatusCmd
		}); ok {
			err := p.Ping(ctx).Err()
			if err != nil && refused(err) {
				var rerr redis.Error
				if !errors.As(err, &rerr) {
					return fmt.Errorf("the server does not speak the Redis protocol (is it Redis?); check the URL's port: %w", err)
				}
			}
			return err
		}
		return nil
	})
	// Nodes that refuse the URL's credentials or database number, enough
	// of them that no majority is possible, make the URL invalid.
	if d.failure(errs) == driver.ErrInvalidArgument {
		_ = d.Close()
		return nil, urlparam.Wrap("redlockdriver: open", d.quorumErr("ping", errs, driver.ErrInvalidArgument))
	}
	return d, nil
}

// Close closes the clients the driver opened. It does not release grants:
// their keys expire. Closing twice returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	var errs []error
	for _, c := range d.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

func (d *Driver) lockKey(key string) string { return d.prefix + "lock:" + key }

// fenceKey returns the name of key's shared fence counter.
func (d *Driver) fenceKey(key string) string {
	h := fnv.New32a()
	h.Write([]byte(key))
	return d.prefix + "fences:" + strconv.FormatUint(uint64(h.Sum32()%FenceCounters), 10)
}

// legacyFenceKey returns the name of key's per-key fence counter of earlier
// versions.
func (d *Driver) legacyFenceKey(key string) string { return d.prefix + "fence:" + key }

func (d *Driver) nodeTimeout(ttl time.Duration) time.Duration {
	if d.nodeTO > 0 {
		return d.nodeTO
	}
	if ttl <= 0 {
		return time.Second
	}
	return min(max(ttl/10, 10*time.Millisecond), time.Second)
}

// lockScript takes the lock key KEYS[1] if it is absent (or already ours),
// folds the legacy per-key counter KEYS[3], if any, into the shared fence
// counter KEYS[2] (max) and deletes it, raises the shared counter by one
// (INCR, 64-bit) and returns {1, new counter}, or {0, 0} when another owner
// holds the key.
var lockScript = redis.NewScript(redislua.NextFence + `
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif cur ~= ARGV[1] then
  return {0, 0}
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {1, nextFence()}
`)

// foldScript folds the legacy per-key counter KEYS[1] into the shared
// counter KEYS[2] (max) and deletes it. It returns 1, or 0 when the legacy
// counter was already gone.
var foldScript = redis.NewScript(`
local old = redis.call('GET', KEYS[1])
if not old then return 0 end
if tonumber(old) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], old)
end
redis.call('DEL', KEYS[1])
return 1
`)

// fenceScript raises the fence counter to ARGV[2] while the node still
// holds the owner token. It returns 1, or 0 when the owner lost the key.
var fenceScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
`)

// renewScript extends the owner's key and raises the fence counter to
// ARGV[3] unless it is "0". It returns 1 (extended), 2 (the key is missing:
// nothing written) or 0 (another owner holds it). A missing key is not set
// again here: see repairScript.
var renewScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then return 2 end
if cur ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '0' then
  local f = tonumber(redis.call('GET', KEYS[2]) or '0')
  if f < tonumber(ARGV[3]) then redis.call('SET', KEYS[2], ARGV[3]) end
end
return 1
`)

// repairScript sets the owner's key again where it is missing (only if
// absent) and raises the fence counter to ARGV[3] unless it is "0". It runs
// only after a renewal found a majority. It returns 1 (set or already the
// owner's) or 0 (another owner took it meanwhile).
var repairScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif cur ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '0' then
  local f = tonumber(redis.call('GET', KEYS[2]) or '0')
  if f < tonumber(ARGV[3]) then redis.call('SET', KEYS[2], ARGV[3]) end
end
return 1
`)

// releaseScript deletes the owner's key. It returns 1 (deleted), 0 (absent)
// or -1 (another owner holds it).
var releaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
if cur == false then return 0 end
return -1
`)

// Per-node outcomes.
var (
	errNodeHeld     = errors.New("held by another owner")
	errNodeNotOwner = errors.New("owner token not held")
	errNodeMissing  = errors.New("lock key missing")
)

// QuorumError reports the per-node results of an operation that did not
// reach a majority. It matches its Err (driver.ErrNotAcquired,
// driver.ErrLeaseLost, driver.ErrUnavailable, or driver.ErrInvalidArgument
// when enough nodes refused the request as invalid — bad credentials, a
// database number out of range — that no majority was possible) with
// errors.Is, and each
// node's error, through Unwrap() []error.
type QuorumError struct {
	Op     string  // "acquire", "fence", "renew", "release"
	OK     int     // nodes that succeeded
	Quorum int     // nodes needed
	Err    error   // the sentinel the outcome amounts to
	Nodes  []error // per node, in node order; nil where the node succeeded
	names  []string
}

// Error lists the outcome and each failed node.
func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "redlock %s: %d of %d nodes, need %d: %v", e.Op, e.OK, len(e.Nodes), e.Quorum, e.Err)
	for i, err := range e.Nodes {
		if err != nil {
			fmt.Fprintf(&b, "; %s: %v", e.names[i], err)
		}
	}
	return b.String()
}

// Unwrap returns Err followed by each node's error.
func (e *QuorumError) Unwrap() []error {
	out := []error{e.Err}
	for _, err := range e.Nodes {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// each runs fn on every node in parallel, each bounded by timeout, and
// returns the per-node errors (nil on success).
func (d *Driver) each(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, i int, c redis.Scripter) error) []error {
	errs := make([]error, len(d.nodes))
	var wg sync.WaitGroup
	for i, c := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = fn(nctx, i, c)
		}()
	}
	wg.Wait()
	return errs
}

func count(errs []error, target error) int {
	n := 0
	for _, err := range errs {
		if target == nil && err == nil || target != nil && errors.Is(err, target) {
			n++
		}
	}
	return n
}

// refused reports whether a node's err refuses the request or the
// connection's settings as such (redisrefuse.Refused): retrying cannot
// help. A node that answers but does not speak Redis's protocol (the URL
// names the port of another kind of server) counts as refusing too
// (redisrefuse.NotRedis).
func refused(err error) bool { return redisrefuse.Refused(err) || redisrefuse.NotRedis(err) }

// failure is the sentinel of an operation that reached no majority because
// nodes failed: driver.ErrInvalidArgument when the nodes that refused the
// request as invalid are enough on their own to leave no majority,
// driver.ErrUnavailable otherwise.
func (d *Driver) failure(errs []error) error {
	n := 0
	for _, err := range errs {
		if refused(err) {
			n++
		}
	}
	if n > len(d.nodes)-d.quorum {
		return driver.ErrInvalidArgument
	}
	return driver.ErrUnavailable
}

func (d *Driver) quorumErr(op string, errs []error, sentinel error) *QuorumError {
	return &QuorumError{Op: op, OK: count(errs, nil), Quorum: d.quorum, Err: sentinel, Nodes: errs, names: d.names}
}

func grantKey(key, owner string) string { return key + "\x00" + owner }

// fenceOf is the fence of a grant made through this driver, kept for
// repairs on renewal until the grant's TTL has passed without one.
type fenceOf struct {
	fence uint64
	until time.Time
}

// TryAcquire runs one Redlock attempt: the lock key on every node, then the
// fence write, within half the TTL. It returns driver.ErrNotAcquired when
// other owners hold enough nodes that no majority was possible, and an
// error matching driver.ErrUnavailable (a *QuorumError) when too many nodes
// failed or the attempt ran out of time. On failure the key is released on
// every node.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, fmt.Errorf("redlockdriver: acquire %q: %w", req.Key, driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redlockdriver: acquire: %w", err)
	}
	start := time.Now()
	nto := d.nodeTimeout(req.TTL)
	keys := []string{d.lockKey(req.Key), d.fenceKey(req.Key), d.legacyFenceKey(req.Key)}
	// The whole attempt (both rounds) must end within half the TTL.
	callerCtx := ctx
	ctx, cancel := context.WithDeadline(ctx, start.Add(req.TTL/2))
	defer cancel()
	ttlMS := max(req.TTL.Milliseconds(), 1)
	counters := make([]uint64, len(d.nodes))
	errs := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		v, err := lockScript.Run(ctx, c, keys, req.Owner, ttlMS).Slice()
		if err != nil {
			return err
		}
		if len(v) != 2 {
			return fmt.Errorf("lock script returned %v", v)
		}
		if n, _ := v[0].(int64); n != 1 {
			return errNodeHeld
		}
		f, ok := v[1].(int64)
		if !ok || f <= 0 {
			return fmt.Errorf("fence counter %v", v[1])
		}
		counters[i] = uint64(f)
		return nil
	})
	lockErrs := errs
	fail := func(op string, errs []error, sentinel error) (driver.Grant, error) {
		// Release where the key may have been set: not on the nodes that
		// answered that another owner holds it.
		var where []bool
		for _, err := range lockErrs {
			where = append(where, !errors.Is(err, errNodeHeld))
		}
		d.releaseOn(ctx, req.Key, req.Owner, nto, where)
		if callerCtx.Err() != nil {
			return driver.Grant{}, fmt.Errorf("redlockdriver: acquire %q: %w", req.Key, errors.Join(callerCtx.Err(), d.quorumErr(op, errs, sentinel)))
		}
		return driver.Grant{}, fmt.Errorf("redlockdriver: acquire %q: %w", req.Key, d.quorumErr(op, errs, sentinel))
	}
	if ok := count(errs, nil); ok < d.quorum {
		// Unavailable when the nodes that failed (not answered, not
		// "held") leave no majority; otherwise other owners hold it.
		if failed := len(d.nodes) - ok - count(errs, errNodeHeld); failed > len(d.nodes)-d.quorum {
			return fail("acquire", errs, d.failure(errs))
		}
		return fail("acquire", errs, driver.ErrNotAcquired)
	}
	// Every node of the majority raised its counter by one: the fence is
	// the highest of them. Where a majority already holds that value it is
	// written; otherwise a second round writes it, "set if greater",
	// while each node still holds the owner token.
	var fence uint64
	for i, err := range errs {
		if err == nil && counters[i] > fence {
			fence = counters[i]
		}
	}
	atFence := 0
	for i, err := range errs {
		if err == nil && counters[i] == fence {
			atFence++
		}
	}
	if atFence < d.quorum {
		ferrs := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
			n, err := fenceScript.Run(ctx, c, keys[:2], req.Owner, strconv.FormatUint(fence, 10)).Int64()
			if err != nil {
				return err
			}
			if n != 1 {
				return errNodeNotOwner
			}
			return nil
		})
		if count(ferrs, nil) < d.quorum {
			return fail("fence", ferrs, d.failure(ferrs))
		}
	}
	elapsed := time.Since(start)
	drift := req.TTL/100 + 2*time.Millisecond
	if elapsed > req.TTL/2 || req.TTL-elapsed-drift <= 0 {
		return fail("acquire", errs, fmt.Errorf("%w: the attempt took %v of a %v TTL", driver.ErrUnavailable, elapsed, req.TTL))
	}
	d.mu.Lock()
	if len(d.fences) >= 1024 {
		// Leases lost by their deadline are never released through the
		// driver: drop what has expired.
		now := time.Now()
		for k, f := range d.fences {
			if now.After(f.until) {
				delete(d.fences, k)
			}
		}
	}
	d.fences[grantKey(req.Key, req.Owner)] = fenceOf{fence: fence, until: start.Add(req.TTL)}
	d.mu.Unlock()
	return driver.Grant{Fence: fence}, nil
}

// releaseAll removes owner's key from every node, best effort, with a fresh
// context bounded by the node timeout.
func (d *Driver) releaseAll(ctx context.Context, key, owner string, nto time.Duration) {
	d.releaseOn(ctx, key, owner, nto, nil)
}

// releaseOn is releaseAll on the nodes i where where[i] (all when where is
// nil).
func (d *Driver) releaseOn(ctx context.Context, key, owner string, nto time.Duration, where []bool) {
	if where != nil && !slices.Contains(where, true) {
		return
	}
	rctx := context.WithoutCancel(ctx)
	d.each(rctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		if where != nil && !where[i] {
			return nil
		}
		return releaseScript.Run(ctx, c, []string{d.lockKey(key)}, owner).Err()
	})
}

// Renew extends owner's key on every node where it still holds the owner
// token, and succeeds when a majority of the nodes was found holding it;
// then, in a second round, it sets the key again on the nodes where it was
// missing. A node where the key is missing never counts toward the
// majority (see the package doc). It returns an error matching
// driver.ErrLeaseLost (a *QuorumError) when the nodes where the key is
// missing or held by another owner leave no majority, having removed the
// owner's key everywhere, and otherwise a *QuorumError matching
// driver.ErrUnavailable when too few nodes answered.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if d.isClosed() {
		return fmt.Errorf("redlockdriver: renew %q: %w", key, driver.ErrClosed)
	}
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("redlockdriver: renew: %w", err)
	}
	d.mu.Lock()
	fence := d.fences[grantKey(key, owner)].fence
	sent := time.Now()
	d.mu.Unlock()
	nto := d.nodeTimeout(ttl)
	keys := []string{d.lockKey(key), d.fenceKey(key)}
	ttlMS := max(ttl.Milliseconds(), 1)
	fenceArg := strconv.FormatUint(fence, 10)
	errs := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		n, err := renewScript.Run(ctx, c, keys, owner, ttlMS, fenceArg).Int64()
		if err != nil {
			return err
		}
		switch n {
		case 1:
			return nil
		case 2:
			return errNodeMissing
		default:
			return errNodeHeld
		}
	})
	if count(errs, nil) >= d.quorum {
		if missing := count(errs, errNodeMissing); missing > 0 {
			// Best effort: a node not repaired now is found missing again
			// by the next renewal, which needs a majority without it.
			d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
				if !errors.Is(errs[i], errNodeMissing) {
					return nil
				}
				return repairScript.Run(ctx, c, keys, owner, ttlMS, fenceArg).Err()
			})
		}
		d.mu.Lock()
		if f, ok := d.fences[grantKey(key, owner)]; ok {
			f.until = sent.Add(ttl)
			d.fences[grantKey(key, owner)] = f
		}
		d.mu.Unlock()
		return nil
	}
	if against := count(errs, errNodeHeld) + count(errs, errNodeMissing); len(d.nodes)-against < d.quorum {
		d.releaseAll(ctx, key, owner, nto)
		d.forget(key, owner)
		return fmt.Errorf("redlockdriver: renew %q: %w", key, d.quorumErr("renew", errs, driver.ErrLeaseLost))
	}
	return fmt.Errorf("redlockdriver: renew %q: %w", key, d.quorumErr("renew", errs, d.failure(errs)))
}

func (d *Driver) forget(key, owner string) {
	d.mu.Lock()
	delete(d.fences, grantKey(key, owner))
	d.mu.Unlock()
}

// Release deletes owner's key on every node that still holds it. It returns
// nil when a majority deleted it, an error matching driver.ErrLeaseLost when
// a majority answered that the owner does not hold it, and otherwise a
// *QuorumError matching driver.ErrUnavailable.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if d.isClosed() {
		return fmt.Errorf("redlockdriver: release %q: %w", key, driver.ErrClosed)
	}
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("redlockdriver: release: %w", err)
	}
	nto := d.nodeTimeout(0)
	errs := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		n, err := releaseScript.Run(ctx, c, []string{d.lockKey(key)}, owner).Int64()
		if err != nil {
			return err
		}
		if n != 1 {
			return errNodeNotOwner
		}
		return nil
	})
	deleted := count(errs, nil)
	notOwner := 0
	for _, err := range errs {
		if errors.Is(err, errNodeNotOwner) {
			notOwner++
		}
	}
	switch {
	case deleted >= d.quorum:
		d.forget(key, owner)
		return nil
	case len(d.nodes)-notOwner < d.quorum:
		d.forget(key, owner)
		return fmt.Errorf("redlockdriver: release %q: %w", key, d.quorumErr("release", errs, driver.ErrLeaseLost))
	default:
		return fmt.Errorf("redlockdriver: release %q: %w", key, d.quorumErr("release", errs, d.failure(errs)))
	}
}

// MigrateFenceCounters folds every legacy per-key fence counter
// ("Prefix fence:K", written by versions before the shared counters; see
// "Fencing" in the package doc) into its shared counter on the same node,
// raising that counter to the larger of the two, and deletes it: one atomic
// script per counter, found by SCAN on every node in parallel, bounded by
// ctx only. It is an operator's one-off clean-up, safe while clients
// acquire and to run again (it then finds nothing); run it once no client
// of an earlier version is left. It returns the number of counters folded
// over all nodes, and an error joining each failed node's (SCAN missing
// from a node's client matches errors.ErrUnsupported; driver.ErrClosed
// after Close); a failed node keeps its remaining counters, and a later run
// folds them.
func (d *Driver) MigrateFenceCounters(ctx context.Context) (int, error) {
	if d.isClosed() {
		return 0, fmt.Errorf("redlockdriver: migrate fence counters: %w", driver.ErrClosed)
	}
	pattern := globEscaper.Replace(d.prefix+"fence:") + "*"
	folded := make([]int, len(d.nodes))
	var errs []error
	for i, err := range d.each(ctx, maxMigrate, func(ctx context.Context, i int, c redis.Scripter) error {
		s, ok := c.(interface {
			Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
		})
		if !ok {
			return fmt.Errorf("the client cannot SCAN: %w", errors.ErrUnsupported)
		}
		var cursor uint64
		for {
			keys, next, err := s.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				key, ok := strings.CutPrefix(k, d.prefix+"fence:")
				if !ok {
					continue
				}
				n, err := foldScript.Run(ctx, c, []string{k, d.fenceKey(key)}).Int()
				if err != nil {
					return err
				}
				folded[i] += n
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.names[i], err))
		}
	}
	total := 0
	for _, n := range folded {
		total += n
	}
	if len(errs) > 0 {
		return total, fmt.Errorf("redlockdriver: migrate fence counters: %w", errors.Join(errs...))
	}
	return total, nil
}

// maxMigrate bounds MigrateFenceCounters on one node when ctx has no
// earlier deadline.
const maxMigrate = time.Hour

// globEscaper quotes the characters that SCAN MATCH patterns treat
// specially.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
