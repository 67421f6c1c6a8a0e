// Package etcddriver is the dlock driver for etcd (v3 API), using the
// official client go.etcd.io/etcd/client/v3.
//
// Open it by URL with dlock.Open (scheme "etcd", registered in init):
//
//	etcd://host:port[,host:port…][/prefix][?dial_timeout=5s&op_timeout=5s]
//
// or construct it directly with New over a client you already have. The
// prefix defaults to "/dlock". Every endpoint names its host and port (an
// empty host or port, or an endpoint without a port, is an error at Open,
// never a default).
//
// # Layout and ordering
//
// A key K is the directory <prefix>/.locks/<escaped K>/ (see escapeKey: "%"
// and "/" are percent-escaped, so a "/" inside K can never make one key's
// directory a prefix of another's, and so is a leading ".", so no escaped
// key starts with "."). Every acquisition attempt puts one entry
// <prefix>/.locks/<escaped K>/<owner token> in a transaction that succeeds
// only if that entry does not exist, attached to the driver's shared etcd
// lease for the grant's TTL (see Shared leases and loss). The holder of K is
// the entry with the lowest create revision in K's directory; the others
// are waiters, in create-revision order (FIFO). This is etcd's own
// concurrency.Mutex recipe (go.etcd.io/etcd/client/v3/concurrency), with
// one lease per driver and TTL in the place of the session's lease.
//
// # Prefixes
//
// Drivers with different prefixes are independent, whatever the prefixes:
// "/team" and "/team/app" (nested), or "/team" and "/team2". Lock entries
// live only in the reserved child <prefix>/.locks/, and a prefix may not
// have a path element (between slashes) that starts with "." (New panics,
// Open and ValidatePrefix return an error), so no prefix can lie inside
// another prefix's .locks/ directory, and no escaped key (which never
// starts with ".") can be a reserved name. Names under <prefix>/ that start
// with "." are reserved for the driver; keys an application puts under the
// prefix outside .locks/ are never read.
//
// # Upgrading from the layout without .locks/
//
// Versions before the .locks/ directory kept K's entries in
// <prefix>/<escaped K>/, where a driver on "/team" took the entries of a
// driver on "/team/app" for holders of its key "app". Old and new clients do
// not see each other's entries, so they must not run side by side on the
// same prefix: during a rolling upgrade each side would grant a key the
// other holds. Stop every old client of a prefix (or wait until none holds
// or waits for a key: etcdctl get --prefix <prefix>/ --keys-only shows no
// entry outside <prefix>/.locks/) before starting new ones. Nothing needs
// to be deleted: old entries belong to etcd leases and go when those
// expire. Fences (create revisions of the cluster-wide revision) keep
// increasing across the upgrade.
//
// # Fencing
//
// The fencing token of a grant is the create revision of its entry. etcd's
// revision is a cluster-wide logical clock that only grows, survives
// restarts (it is in the replicated, fsynced log) and is never reused, and
// a later holder's entry was necessarily created after an earlier holder's
// (an entry is granted only when it has the lowest create revision), so
// fences are strictly increasing per key for the life of the cluster.
//
// # TTL and expiry
//
// The store owns expiry. A grant's entry is on an etcd lease whose TTL is
// the requested TTL in whole seconds, rounded up, at least 1 s (etcd leases
// have a one-second granularity; the server may raise very short TTLs to its
// own minimum, 1.5 × the election timeout). The store therefore never
// expires a grant before the client-side validity deadline (sent + TTL −
// drift, or sent + Grant.ValidFor − drift until the first renewal of a
// grant made without a keepalive: see Shared leases) that the dlock root
// package computes, only later. A newly elected
// etcd leader extends every lease by its election timeout, so expiry can
// come late, never early.
//
// # Shared leases and loss
//
// A Driver does not grant an etcd lease per grant: like a
// concurrency.Session, it keeps one lease per distinct TTL (in whole
// seconds), granted when the first entry of that TTL needs it, and puts
// every entry of that TTL on it: plain grants, read locks, waiters. So a
// grant costs one write (the put transaction) and a release one (the
// conditional delete), and etcd keeps one lease, not one per held key. One
// goroutine per lease sends a KeepAliveOnce every third of its TTL while
// the driver is open, and revokes the lease once no entry has used it for
// a whole TTL; Close revokes the leases that hold no grant. What this means:
//
//   - One lease lost is every grant on it lost at once. When a lease ends
//     on the store (the process stopped or was cut off from etcd for a
//     lease TTL, or someone revoked it), etcd deletes every entry on it:
//     each grant's Grant.Lost closes, each waiter's Wait returns an error
//     matching driver.ErrLeaseLost, and the driver's next entry of that
//     TTL gets a new lease. Grants of another TTL are on another lease.
//   - A grant its holder stops renewing still ends one lease TTL after its
//     grant or its last confirmed renewal, as its own lease would have:
//     the lease's goroutine deletes the entry then (conditioned on its
//     create revision and its lease), while the other grants stay. This
//     runs on the client's clock; when the process itself stops, the
//     shared lease's expiry on the store ends every grant within a TTL.
//   - A shared lease's last confirmed keepalive may be most of a TTL old
//     (more, after a stretch of failed keepalives), and etcd ends an entry
//     with its lease. So an acquisition puts its entry and, beside that
//     transaction, waits for a KeepAliveOnce of the lease sent after the
//     attempt began (shared with concurrent attempts, skipped when one
//     already was): only then does etcd keep the entry a TTL from the
//     request, as the validity deadline assumes. Without it, a grant put
//     on a lease whose keepalives had just stalled (replies lost, a leader
//     paused) ended on the store while its holder still counted on it,
//     and the next holder was granted early (found by dlock verify).
//     An acquisition skips that keepalive while the lease's last confirmed
//     one leaves at least three fifths of the TTL (the lease's own
//     keepalives, every third of its TTL, keep it so): the grant then says
//     how long etcd keeps the entry from the request (driver.Grant.ValidFor,
//     the lease's TTL from that keepalive), and the dlock client counts the
//     lease valid to that, not a TTL, until its first renewal, which it
//     sends a third of the way into it (before Acquire returns for a
//     waiter granted later than that). So the first renewal has two thirds
//     of ValidFor, at least 0.4 of the TTL, to get through (a store
//     outage, an election) where other renewals have two thirds of the TTL.
//   - Renew waits for a KeepAliveOnce of the grant's lease sent after Renew
//     began (concurrent renewals of one lease share it), then reads the
//     entry back: etcd then keeps the entry at least a TTL from the call.
//     A Renew whose ttl is another number of seconds than the lease's
//     moves the entry to the shared lease of that TTL, by a put
//     conditioned on its create revision: the TTL of a grant follows its
//     renewals, as the ttl argument says. A renewal of a grant the driver
//     did not make (another process's) sends one KeepAliveOnce for the
//     lease its entry names, as before.
//   - A grant's fence is the create revision of its entry (see Fencing).
//     Moving an entry to another lease (a Renew with another TTL, a
//     Resume) is a put of the existing key, which keeps its create
//     revision: the fence never changes for the life of the grant.
//   - Inspect and List report the time left on the shared lease, which its
//     keepalives hold between two thirds of the TTL and the TTL: the bound
//     on when the grant ends if its process stops, not when its holder
//     last renewed.
//
// # Capabilities
//
//   - driver.Waiter: each waiter watches only the entry just before its own
//     (its delete event), so a release wakes exactly one waiter, in FIFO
//     order, with no herd. While waiting, the waiter's entry is on the
//     shared lease, which Wait checks is kept alive every third of its TTL;
//     if that lease dies (revoked, expired) or its entry is deleted, Wait
//     stops with an error matching driver.ErrLeaseLost. A cancelled waiter
//     deletes its entry (and a grant that raced the cancellation), using a
//     fresh bounded context; an entry it cannot delete then (the store
//     unreachable) is deleted by the lease's goroutine later.
//   - Pushed loss: every grant's Grant.Lost is closed when its entry is
//     deleted on the store (lease expired or revoked, entry deleted), by a
//     watch of the entry that starts 50 ms after the grant from the
//     grant's revision on (so a grant released sooner costs no watch, and
//     a delete before the watch starts is reported when it does). The
//     watch ends on Release, on loss, and on Close.
//   - driver.Inspector: Inspect and List. Both report each holder's time
//     left (HolderInfo.Remaining) as etcd's LeaseTimeToLive says of the
//     lease its entry is on, in whole seconds, not the TTL it was granted
//     with.
//   - driver.SharedLocker: read-write locks (etcd's RWMutex recipe; Shared
//     with Limit 0 and Exclusive; no counted permits), whose Exclusive
//     grants are plain locks of the same key (see SharedView in shared.go).
//   - driver.Resumer: a restarted process resumes its grant
//     (Locker.Resume) by moving its entry, create revision kept, onto its
//     own shared lease, with the loss watch attached again (see Resume).
//
// # Store outages
//
// The root package bounds TryAcquire, Renew and Release by its op timeout.
// Wait gets the caller's context only, so the driver bounds each of its own
// round trips inside Wait by Options.OpTimeout (URL parameter op_timeout,
// default 5 s): a waiter that cannot reach the store, or cannot keep its
// lease alive, returns a store error (ErrUnavailable at the root) instead of
// waiting on. Set op_timeout to the locker's WithOpTimeout.
//
// # Release
//
// Release deletes the entry in a transaction conditioned on its create
// revision being the grant's fence, so a replayed release can never delete a
// newer grant; the next waiter is told by the delete. The shared lease
// stays for the driver's other entries. An owner the driver cannot find on
// the store answers driver.ErrLeaseLost.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the etcd and etcd3 sections of docs/GUARANTEES.md hold the
// figures, for one member, and three (partitions, leader isolation, kill
// and pause). make verify regenerates them.
package etcddriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/notgrpc"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("etcd", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return Open(ctx, u)
	})
}

// Client is the part of *clientv3.Client the driver uses; a
// *clientv3.Client satisfies it (as does a namespaced or wrapped client).
type Client interface {
	clientv3.KV
	clientv3.Lease
	clientv3.Watcher
}

// Options configure a Driver. A nil *Options selects every default.
type Options struct {
	// Prefix is the key prefix under which all lock entries live (in
	// Prefix + "/.locks/"); a trailing "/" is dropped. No path element of
	// it may start with "." (see ValidatePrefix). Zero value: "/dlock".
	Prefix string
	// OpTimeout bounds each store round trip the driver makes on its own
	// inside Wait (lease grant, keepalive, checks) and the cleanup after a
	// cancelled or failed attempt. Zero value: 5 s.
	OpTimeout time.Duration
}

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "/dlock"

const defaultOpTimeout = 5 * time.Second

// Driver is a dlock driver over one etcd client. It implements
// driver.Driver, driver.Waiter, driver.Inspector, driver.Resumer and
// driver.SharedLocker (read-write locks), and is safe for concurrent use.
type Driver struct {
	cli       Client
	closeCli  func() error // nil when the client is not ours
	prefix    string
	locks     string // prefix + "/.locks/": every lock entry is under it
	opTimeout time.Duration

	closeCtx    context.Context
	closeCancel context.CancelFunc
	wg          sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	grants   map[string]*grant      // by entry key
	leases   map[int64]*sharedLease // by TTL in seconds (see leases.go)
	creating map[int64]*leaseCreate // lease grants in flight, by TTL in seconds
}

// grant is a grant held through this driver.
type grant struct {
	sl     *sharedLease // the lease its entry is on (guarded by d.mu)
	fence  int64        // create revision of the entry
	holder string
	lost   chan struct{}
	once   sync.Once          // closes lost
	cancel context.CancelFunc // stops the loss watcher
	watch  *time.Timer        // starts the loss watcher (see lossWatchDelay)
	// deadline is when the grant ends unless renewed (guarded by d.mu):
	// the last grant or confirmed renewal plus the lease TTL, as its own
	// etcd lease would have ended. The lease's loop deletes the entry then.
	deadline time.Time
	// expiring is set (guarded by d.mu) when the lease's loop has found
	// the deadline passed and is deleting the entry: from then on the
	// grant is ended, and a renewal in flight, though it may still have
	// found the entry, reports it lost instead of extending the deadline.
	expiring bool
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Waiter    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
)

// New returns a driver over cli. It never closes cli: Close only stops the
// driver's own goroutines. opts may be nil. It returns the error of
// ValidatePrefix when opts.Prefix is invalid (a configuration error, never
// ErrUnavailable).
func New(cli Client, opts *Options) (*Driver, error) {
	var prefix string
	if opts != nil {
		prefix = opts.Prefix
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	return newDriver(cli, nil, opts), nil
}

func newDriver(cli Client, closeCli func() error, opts *Options) *Driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	o.Prefix = strings.TrimRight(o.Prefix, "/")
	if o.OpTimeout <= 0 {
		o.OpTimeout = defaultOpTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Driver{
		cli: cli, closeCli: closeCli, prefix: o.Prefix, locks: o.Prefix + "/" + locksDir + "/", opTimeout: o.OpTimeout,
		closeCtx: ctx, closeCancel: cancel,
		grants: map[string]*grant{}, leases: map[int64]*sharedLease{}, creating: map[int64]*leaseCreate{},
	}
}

// Open connects to the etcd cluster named by u,
// etcd://host:port[,host:port…][/prefix], with the optional query
// parameters dial_timeout and op_timeout (Go durations). It returns an error
// at once when the path is not a valid prefix (see ValidatePrefix). The
// driver owns the client and closes it in Close. Open reads from the cluster
// once, and
// returns an error wrapping driver.ErrUnavailable when no endpoint answers
// within ctx and dial_timeout (default 5 s), or driver.ErrInvalidArgument
// when an endpoint answers but does not speak gRPC (the URL names the port
// of another kind of server). An invalid URL (another scheme,
// no endpoint, an empty host or port, an endpoint without a port, a port
// outside 1..65535, an unknown or malformed parameter, a reserved prefix)
// returns an error matching driver.ErrInvalidArgument instead.
func Open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != "etcd" {
		return nil, urlparam.Invalid("etcddriver: URL scheme %q, want etcd", u.Scheme)
	}
	if err := urlparam.Addrs("etcddriver", u.Host, "etcd://HOST:PORT[,HOST:PORT…][/prefix]", true); err != nil {
		return nil, err
	}
	q := u.Query()
	if err := urlparam.Known("etcddriver", q, "dial_timeout", "op_timeout"); err != nil {
		return nil, err
	}
	dialTimeout := 5 * time.Second
	var opts Options
	if err := urlparam.Durations(q, map[string]*time.Duration{"dial_timeout": &dialTimeout, "op_timeout": &opts.OpTimeout}); err != nil {
		return nil, urlparam.Wrap("etcddriver", err)
	}
	endpoints := urlparam.Hosts(u.Host)
	cfg := clientv3.Config{
		// Reconnect within a second of the store coming back (gRPC's
		// default backoff grows to two minutes).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
		Endpoints:            endpoints,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
		Context:              context.WithoutCancel(ctx),
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if err := ValidatePrefix(u.Path); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		if refused(err) { // credentials refused
			return nil, urlparam.Wrap("etcddriver: etcd at "+u.Host+" refused the connection's settings", err)
		}
		return nil, fmt.Errorf("etcddriver: connect %s: %w: %w", u.Host, driver.ErrUnavailable, err)
	}
	opts.Prefix = u.Path
	// Fail at once when no endpoint answers (the client connects lazily).
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	_, err = cli.Get(pctx, "/", clientv3.WithCountOnly(), clientv3.WithSerializable())
	cancel()
	if err != nil {
		cli.Close()
		if refused(err) {
			return nil, urlparam.Wrap("etcddriver: etcd at "+u.Host+" refused the connection's settings", err)
		}
		// The client waits for a ready connection and reports only the
		// deadline: ask each endpoint once, failing fast, whether it
		// speaks gRPC at all. One that answers in another protocol (the
		// port of Redis, of an HTTP server, ...) makes the URL invalid.
		for _, ep := range endpoints {
			if detail, ok := notgrpc.Probe(ctx, ep, time.Second); ok {
				return nil, urlparam.Invalid("etcddriver: the server at %s does not speak etcd's protocol (is it etcd?); check the URL's port (gRPC: %s)", ep, detail)
			}
		}
		return nil, fmt.Errorf("etcddriver: connect %s: %w: %w", u.Host, driver.ErrUnavailable, err)
	}
	return newDriver(cli, cli.Close, &opts), nil
}

// Close stops the driver's loss watchers and ends pending waits, then closes
// the client if the driver opened it. It does not release grants: their
// leases expire on the store. Closing twice returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, g := range d.grants {
		g.stop(d)
	}
	d.grants = map[string]*grant{}
	idle := d.closeLeasesLocked()
	d.mu.Unlock()
	// Leases no entry uses any more are revoked, all at once and for at
	// most closeRevokeTimeout (a store that does not answer must not hold
	// Close up: the lease, holding no key, then ends with its TTL); those
	// of grants still held end with their TTL on the store.
	var rwg sync.WaitGroup
	for _, id := range idle {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rctx, cancel := context.WithTimeout(context.Background(), min(d.opTimeout, closeRevokeTimeout))
			defer cancel()
			_, _ = d.cli.Revoke(rctx, id)
		}()
	}
	d.closeCancel()
	d.wg.Wait()
	rwg.Wait()
	if d.closeCli != nil {
		return d.closeCli()
	}
	return nil
}

// closeRevokeTimeout bounds Close's revocation of the shared leases no
// entry uses.
const closeRevokeTimeout = 500 * time.Millisecond

// locksDir is the reserved child of the prefix that holds every lock entry.
const locksDir = ".locks"

// ValidatePrefix reports whether prefix can be a driver's Options.Prefix
// (or an etcd URL's path): it returns an error (matching
// driver.ErrInvalidArgument) when a path element of
// prefix (the text between two "/") starts with ".", since names starting
// with "." are reserved for the driver (its lock entries are under
// <prefix>/.locks/). This is what keeps the entries of drivers with nested
// prefixes apart: a prefix "/team/.locks/x" would put its entries among the
// keys of the prefix "/team". The empty prefix selects DefaultPrefix.
func ValidatePrefix(prefix string) error {
	for _, el := range strings.Split(prefix, "/") {
		if strings.HasPrefix(el, ".") {
			return urlparam.Invalid("etcddriver: prefix %q: path element %q starts with \".\" (names starting with \".\" are reserved, e.g. %q)",
				prefix, el, locksDir)
		}
	}
	return nil
}

// escapeKey percent-escapes "%" and "/", and a "." that starts the key (and
// nothing else), so an escaped key never contains "/", never starts with
// "." (names starting with "." are reserved, see locksDir), and escaping is
// injective and prefix-preserving.
func escapeKey(key string) string {
	if !strings.ContainsAny(key, "%/") && !strings.HasPrefix(key, ".") {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '%':
			b.WriteString("%25")
		case c == '/':
			b.WriteString("%2F")
		case c == '.' && i == 0:
			b.WriteString("%2E")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// unescapeKey reverses escapeKey.
func unescapeKey(s string) (string, error) {
	return url.PathUnescape(s)
}

// dir returns the directory of key, <prefix>/.locks/<escaped key>/, with its
// trailing "/".
func (d *Driver) dir(key string) string { return d.locks + escapeKey(key) + "/" }

// entry returns the entry of owner on key.
func (d *Driver) entry(key, owner string) string { return d.dir(key) + owner }

// keyOfEntry returns the key of a lock entry's etcd key,
// <prefix>/.locks/<escaped key>/<owner>, or false when k is not one.
func (d *Driver) keyOfEntry(k string) (string, bool) {
	rest, ok := strings.CutPrefix(k, d.locks)
	if !ok {
		return "", false
	}
	esc, owner, ok := strings.Cut(rest, "/")
	if !ok || esc == "" || owner == "" || strings.Contains(owner, "/") {
		return "", false
	}
	key, err := unescapeKey(esc)
	if err != nil || escapeKey(key) != esc {
		return "", false
	}
	return key, true
}

// value is what an entry stores.
type value struct {
	Holder string        `json:"holder,omitempty"`
	TTL    time.Duration `json:"ttl"`
}

// leaseSeconds converts a TTL to etcd's whole seconds, rounding up, at least
// 1.
func leaseSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// storeErr wraps an error of op. The root package adds the key and the
// store's URL, so they are not repeated here.
func storeErr(op string, err error) error {
	if errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrClosed) {
		return fmt.Errorf("etcddriver: %s: %w", op, err)
	}
	if errors.Is(err, driver.ErrInvalidArgument) {
		return fmt.Errorf("etcddriver: %s: %w", op, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcddriver: %s: %w", op, err)
	}
	if code, ok := errCode(err); ok && (code == codes.PermissionDenied || code == codes.Unauthenticated) {
		// Bad credentials or no permission: ErrPermissionDenied (it
		// matches ErrInvalidArgument too), never an outage.
		return fmt.Errorf("etcddriver: %s: %w: etcd refused the credentials: %w", op, driver.ErrPermissionDenied, err)
	}
	if refused(err) {
		return urlparam.Wrap("etcddriver: "+op+": etcd refused the request", err)
	}
	return fmt.Errorf("etcddriver: %s: %w: %w", op, driver.ErrUnavailable, err)
}

// errCode returns the gRPC code of an etcd answer.
func errCode(err error) (codes.Code, bool) {
	var coded interface{ Code() codes.Code }
	if errors.As(err, &coded) {
		return coded.Code(), true
	}
	if st, ok := status.FromError(err); ok {
		return st.Code(), true
	}
	return codes.OK, false
}

// refused reports whether err is an answer in which etcd refused the
// request itself (its gRPC code is InvalidArgument, OutOfRange,
// PermissionDenied or Unauthenticated: a request too large, a lease TTL
// too large, bad credentials, no permission), which retrying cannot help.
// etcd's transient answers (no leader, timeouts, leader changed) have the
// code Unavailable and are not refusals.
func refused(err error) bool {
	var coded interface{ Code() codes.Code }
	if !errors.As(err, &coded) {
		st, ok := status.FromError(err)
		if !ok {
			return false
		}
		coded = st
	}
	switch coded.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// queued is an entry put by enqueue.
type queued struct {
	sl    *sharedLease // the lease of the entry; the queued entry is one of its users
	rev   int64        // create revision of the entry: the fence if granted
	pred  string       // the entry just before it, "" when it is the holder
	ahead int64        // number of entries before it
	seen  int64        // store revision at which pred and ahead were read
	// validFor > 0: the entry lives at least this long from the request,
	// less than its TTL (see putEntry); 0: a TTL from the request.
	validFor time.Duration
}

// enqueue puts req's entry on the driver's shared lease for req.TTL, in a
// transaction that first reads the last entry created before it (its
// predecessor) and how many entries are ahead. An entry that exists
// already (the same owner token retried after an answer was lost) is put
// again on the shared lease, keeping its create revision. On an error, an
// entry the transaction may have put is deleted (see abandon).
func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest) (queued, error) {
	val, _ := json.Marshal(value{Holder: req.Holder, TTL: req.TTL})
	k := d.entry(req.Key, req.Owner)
	dir := d.dir(req.Key)
	resp, sl, validFor, err := d.putEntry(ctx, req.TTL, k, string(val),
		clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithPrefix(), clientv3.WithKeysOnly())...))
	if err != nil {
		return queued{}, err
	}
	if !resp.Succeeded {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 {
			sl.unuse()
			return queued{}, fmt.Errorf("entry %q vanished", k)
		}
		q, err := d.ahead(ctx, k, dir, queued{sl: sl, rev: kvs[0].CreateRevision, validFor: validFor})
		if err != nil {
			sl.unuse()
		}
		return q, err
	}
	q := queued{sl: sl, rev: resp.Header.Revision, seen: resp.Header.Revision, validFor: validFor}
	rr := resp.Responses[0].GetResponseRange()
	if len(rr.Kvs) > 0 {
		q.pred = string(rr.Kvs[0].Key)
		q.ahead = rr.Count
	}
	return q, nil
}

// putEntry puts entry k with val on the shared lease for ttl, in one
// transaction: when k does not exist, it runs read first and then the put
// (Succeeded; read's answer is Responses[0]); when it exists (the same owner
// token retried), it puts k again with the shared lease, which keeps its
// create revision, and reads it back (not Succeeded; Responses[1]). The
// returned lease counts the entry as one of its users. A lease etcd no
// longer knows (it expired while the store was unreachable) is dropped and
// the put tried once more on a new one. On any other error, an entry the
// transaction may have put is deleted (abandon) and no lease is returned.
// It returns only once a keepalive of the lease sent after the call began
// was confirmed (see the package doc's Shared leases), or with its error;
// except when the lease's last confirmed keepalive leaves the entry at
// least three fifths of ttl from the call (the lease's own keepalives,
// every third of its TTL, leave two thirds or more): putEntry then sends
// none and returns that time (validFor, less than ttl), the grant's
// Grant.ValidFor.
// validFor is 0 when the entry lives ttl from the call.
func (d *Driver) putEntry(ctx context.Context, ttl time.Duration, k, val string, read clientv3.Op) (*clientv3.TxnResponse, *sharedLease, time.Duration, error) {
	for try := 0; ; try++ {
		start := time.Now()
		sl, err := d.useLease(ctx, ttl)
		if errors.Is(err, errClosed) {
			return nil, nil, 0, driver.ErrClosed
		}
		if err != nil {
			return nil, nil, 0, err
		}
		// The shared lease was last confirmed up to a TTL ago, and etcd
		// ends the entry with it: the entry lives a TTL from start only
		// once a keepalive sent after start is confirmed. It runs beside
		// the transaction (shared with concurrent callers), so it costs
		// no round trip of its own; it is skipped while the lease's own
		// keepalives (every third of its TTL) keep it fresh enough, and
		// the grant then says how long it has (Grant.ValidFor).
		kept := make(chan error, 1)
		var validFor time.Duration
		if left := sl.keptFrom(start); sl.confirmedSince(start) || left >= ttl {
			kept <- nil // a fresh lease: its grant was sent after start
		} else if left >= ttl*3/5 {
			validFor = left
			kept <- nil
		} else {
			go func() { kept <- sl.keepAlive(ctx) }()
		}
		resp, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(read, clientv3.OpPut(k, val, clientv3.WithLease(sl.id))).
			Else(clientv3.OpPut(k, val, clientv3.WithLease(sl.id)), clientv3.OpGet(k)).
			Commit()
		kerr := <-kept
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && errors.Is(kerr, rpctypes.ErrLeaseNotFound)) {
			// Nothing was put (the transaction failed as a whole), or
			// what was put ended with the lease.
			sl.markDead()
			sl.unuse()
			if try == 0 {
				continue
			}
			if err == nil {
				err = kerr
			}
			return nil, nil, 0, err
		}
		if err == nil && kerr != nil {
			if errors.Is(kerr, errClosed) {
				kerr = driver.ErrClosed
			}
			err = fmt.Errorf("keepalive of etcd lease %x: %w", int64(sl.id), kerr)
		}
		if err == nil {
			return resp, sl, validFor, nil
		}
		d.abandon(ctx, sl, k, 0)
		return nil, nil, 0, err
	}
}

// ahead re-reads, in one transaction, that q's entry k still exists and
// which entries are ahead of it. It returns an error matching
// driver.ErrLeaseLost when the entry is gone.
func (d *Driver) ahead(ctx context.Context, k, dir string, q queued) (queued, error) {
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", q.rev)).
		Then(clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(q.rev-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))).
		Commit()
	if err != nil {
		return q, err
	}
	if !resp.Succeeded {
		return q, fmt.Errorf("%w: %w", driver.ErrLeaseLost, errWaiterLost)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	q.pred, q.ahead, q.seen = "", int64(len(kvs)), resp.Header.Revision
	if len(kvs) > 0 {
		q.pred = string(kvs[0].Key)
	}
	return q, nil
}

// revoke revokes a lease (deleting its entries) with a fresh context bounded by
// the op timeout, so that it runs even when ctx has ended.
func (d *Driver) revoke(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	_, _ = d.cli.Revoke(rctx, id)
}

// TryAcquire puts req's entry and keeps it only when it is the lowest of the
// key (the holder); otherwise it deletes the entry and returns
// driver.ErrNotAcquired.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, storeErr("acquire", driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	q, err := d.enqueue(ctx, req)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	if q.pred != "" {
		d.abandon(ctx, q.sl, d.entry(req.Key, req.Owner), q.rev)
		return driver.Grant{}, storeErr("acquire", driver.ErrNotAcquired)
	}
	return d.granted(req, q)
}

// granted records a grant (its entry one of q.sl's users) and starts its
// loss watcher.
func (d *Driver) granted(req driver.AcquireRequest, q queued) (driver.Grant, error) {
	k := d.entry(req.Key, req.Owner)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.abandon(context.Background(), q.sl, k, q.rev)
		return driver.Grant{}, storeErr("acquire", driver.ErrClosed)
	}
	if old, ok := d.grants[k]; ok && old.fence == q.rev {
		if err := d.reuseExpiringLocked(k, old, q.sl, q.rev); err != nil {
			d.mu.Unlock()
			return driver.Grant{}, storeErr("acquire", err)
		}
		if old.sl != q.sl { // a repeat with another TTL put the entry on q.sl
			if old.sl.grants[k] == old {
				delete(old.sl.grants, k)
				old.sl.unuseLocked()
			}
			old.sl = q.sl
			q.sl.grants[k] = old
		} else {
			q.sl.unuseLocked() // the grant counts once
		}
		// The repeat confirmed the entry now: it ends a TTL of its lease
		// from now, as after a renewal (not at the deadline of the lease
		// it was on, which a shorter TTL may have passed).
		if end := time.Now().Add(q.sl.ttl); end.After(old.deadline) {
			old.deadline = end
		}
		d.mu.Unlock()
		return driver.Grant{Fence: uint64(q.rev), Lost: old.lost, ValidFor: q.validFor}, nil
	}
	g := d.trackLocked(k, q.sl, q.rev, req.Holder)
	d.mu.Unlock()
	return driver.Grant{Fence: uint64(q.rev), Lost: g.lost, ValidFor: q.validFor}, nil
}

// trackLocked records the grant of entry k (create revision rev) on sl, of
// which it is already counted a user, and starts its loss watcher. Call
// with d.mu held and the driver open.
func (d *Driver) trackLocked(k string, sl *sharedLease, rev int64, holder string) *grant {
	ctx, cancel := context.WithCancel(d.closeCtx)
	g := &grant{sl: sl, fence: rev, holder: holder, lost: make(chan struct{}), cancel: cancel, deadline: time.Now().Add(sl.ttl)}
	d.grants[k] = g
	sl.grants[k] = g
	d.wg.Add(1)
	// The watch starts from the revision after the grant's, so a delete
	// before it starts is still reported; starting it later spares the
	// store a watch for every grant released within lossWatchDelay.
	g.watch = time.AfterFunc(lossWatchDelay, func() { d.watchLoss(ctx, k, g) })
	return g
}

// lossWatchDelay is how long after a grant its loss watch starts: a grant
// whose entry is deleted within it (by expiry, revocation, another
// process) is reported lost when the watch starts, replaying the delete.
const lossWatchDelay = 50 * time.Millisecond

// stop ends g's loss watch, or cancels its start. Call with d.mu held or
// not.
func (g *grant) stop(d *Driver) {
	g.cancel()
	if g.watch.Stop() {
		d.wg.Done() // the watch never started
	}
}

// watchLoss closes g.lost when entry k (created at g.fence) is deleted. It
// ends when ctx is cancelled (release, close) or after the loss.
func (d *Driver) watchLoss(ctx context.Context, k string, g *grant) {
	defer d.wg.Done()
	from := g.fence + 1
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := d.cli.Watch(wctx, k, clientv3.WithRev(from), clientv3.WithFilterPut())
		for resp := range wch {
			if err := resp.Err(); err != nil {
				break // compacted or cancelled: re-read the entry
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					cancel()
					d.markLost(k, g)
					return
				}
			}
			from = resp.Header.Revision + 1
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		gctx, gcancel := context.WithTimeout(ctx, d.opTimeout)
		resp, err := d.cli.Get(gctx, k)
		gcancel()
		if err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.fence {
				d.markLost(k, g)
				return
			}
			from = resp.Header.Revision + 1
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *Driver) markLost(k string, g *grant) {
	d.mu.Lock()
	d.untrackLocked(k, g)
	d.mu.Unlock()
	g.stop(d)
	g.once.Do(func() { close(g.lost) })
}

// untrackLocked stops tracking grant g of entry k (if it still is), counting
// it off its lease. Call with d.mu held.
func (d *Driver) untrackLocked(k string, g *grant) {
	if d.grants[k] == g {
		delete(d.grants, k)
	}
	if g.sl.grants[k] == g {
		delete(g.sl.grants, k)
		g.sl.unuseLocked()
	}
}

// forget stops tracking the grant of entry k, if any, and returns it.
func (d *Driver) forget(k string) *grant {
	d.mu.Lock()
	g := d.grants[k]
	if g != nil {
		d.untrackLocked(k, g)
	}
	d.mu.Unlock()
	if g != nil {
		g.stop(d)
	}
	return g
}

// lookup returns the lease and create revision of owner's entry on key, as
// the store has them. It returns driver.ErrLeaseLost when the entry does
// not exist.
func (d *Driver) lookup(ctx context.Context, k string) (clientv3.LeaseID, int64, error) {
	resp, err := d.cli.Get(ctx, k)
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, 0, driver.ErrLeaseLost
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), resp.Kvs[0].CreateRevision, nil
}

// Renew confirms the grant for ttl from the time of the call. For a grant
// this driver made (or resumed), it waits for a KeepAliveOnce of the
// grant's shared lease sent after the call began (concurrent renewals of
// the lease's grants share one), then reads the entry back; the grant's
// own end (see the package doc) moves to the call's start plus the lease
// TTL. A ttl of another whole number of seconds than the lease's moves the
// entry to the shared lease of that TTL (a put conditioned on the entry's
// create revision, which keeps it: the fence does not change). For a grant
// this driver does not track (made by another process), it sends one
// KeepAliveOnce for the lease the entry names (ttl is not used) and reads
// the entry back. It returns driver.ErrLeaseLost when the lease is gone or
// the entry was deleted or replaced.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if d.isClosed() {
		return storeErr("renew", driver.ErrClosed)
	}
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return storeErr("renew", err)
	}
	start := time.Now()
	k := d.entry(key, owner)
	d.mu.Lock()
	g := d.grants[k]
	var sl *sharedLease
	expiring := false
	if g != nil {
		sl, expiring = g.sl, g.expiring
	}
	d.mu.Unlock()
	if g == nil {
		return d.renewUntracked(ctx, k)
	}
	if expiring {
		return storeErr("renew", errExpiring)
	}
	if leaseSeconds(ttl) != sl.secs {
		return d.move(ctx, k, g, ttl, start)
	}
	if err := sl.keepAlive(ctx); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			d.forget(k)
			return storeErr("renew", fmt.Errorf("%w: etcd lease %x not found", driver.ErrLeaseLost, int64(sl.id)))
		}
		if errors.Is(err, errClosed) {
			err = driver.ErrClosed
		}
		return storeErr("renew", err)
	}
	resp, err := d.cli.Get(ctx, k)
	if err != nil {
		return storeErr("renew", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.fence {
		d.forget(k)
		return storeErr("renew", fmt.Errorf("%w: entry deleted", driver.ErrLeaseLost))
	}
	if id := clientv3.LeaseID(resp.Kvs[0].Lease); id != sl.id {
		// Resumed by another process, which put the entry on its own
		// lease: both hold the owner token now, and this driver's
		// keepalive no longer vouches for the entry. Renew the lease it
		// is on, as for a grant made elsewhere.
		if _, err := d.cli.KeepAliveOnce(ctx, id); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				d.forget(k)
				return storeErr("renew", fmt.Errorf("%w: etcd lease %x not found", driver.ErrLeaseLost, int64(id)))
			}
			return storeErr("renew", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if g.expiring {
		// The lease's loop found the deadline passed while this renewal
		// was in flight and is deleting the entry (its delete may come
		// after the read above): the grant ended at its deadline.
		return storeErr("renew", errExpiring)
	}
	if end := start.Add(sl.ttl); end.After(g.deadline) {
		g.deadline = end
	}
	return nil
}

// reuseExpiringLocked is the check of a repeated acquire or a Resume that
// finds its grant old still tracked, its entry now on sl (of which the
// caller is counted a user): when the lease's loop is deleting old's
// entry (old.expiring), the grant ended at its deadline, so it returns
// errExpiring, counts the caller off sl and, when the entry was moved to
// sl (where the loop's delete, conditioned on the old lease, fails),
// leaves it to sl's loop as an orphan. Call with d.mu held.
func (d *Driver) reuseExpiringLocked(k string, old *grant, sl *sharedLease, rev int64) error {
	if !old.expiring {
		return nil
	}
	if old.sl != sl && !sl.gone {
		sl.orphans[k] = rev
	}
	sl.unuseLocked()
	return errExpiring
}

// errExpiring is Renew's answer for a grant whose deadline passed and whose
// entry the lease's loop is deleting.
var errExpiring = fmt.Errorf("%w: not renewed within its TTL (the entry is being deleted)", driver.ErrLeaseLost)

// move puts grant g's entry k on the shared lease for ttl, conditioned on
// its create revision (kept by the put), after a keepalive of that lease
// sent after start.
func (d *Driver) move(ctx context.Context, k string, g *grant, ttl time.Duration, start time.Time) error {
	nsl, err := d.useLease(ctx, ttl)
	if errors.Is(err, errClosed) {
		err = driver.ErrClosed
	}
	if err != nil {
		return storeErr("renew", err)
	}
	if err := nsl.keepAlive(ctx); err != nil {
		nsl.unuse()
		if errors.Is(err, errClosed) {
			err = driver.ErrClosed
		}
		return storeErr("renew", err)
	}
	val, _ := json.Marshal(value{Holder: g.holder, TTL: ttl})
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", g.fence)).
		Then(clientv3.OpPut(k, string(val), clientv3.WithLease(nsl.id))).
		Commit()
	if err != nil {
		nsl.unuse()
		return storeErr("renew", err)
	}
	if !resp.Succeeded {
		nsl.unuse()
		d.forget(k)
		return storeErr("renew", fmt.Errorf("%w: entry deleted", driver.ErrLeaseLost))
	}
	d.mu.Lock()
	if g.expiring {
		// The old lease's loop is deleting the entry (its delete,
		// conditioned on the old lease, fails now and marks the grant
		// lost): the grant ended at its deadline, and the entry now on
		// nsl is an orphan for nsl's loop to delete.
		if !nsl.gone {
			nsl.orphans[k] = g.fence
		}
		nsl.unuseLocked()
		d.mu.Unlock()
		return storeErr("renew", errExpiring)
	}
	if d.grants[k] == g {
		old := g.sl
		delete(old.grants, k)
		old.unuseLocked()
		g.sl = nsl
		nsl.grants[k] = g
		g.deadline = start.Add(nsl.ttl)
	} else {
		nsl.unuseLocked() // released meanwhile
	}
	d.mu.Unlock()
	return nil
}

// renewUntracked renews the entry k of a grant this driver does not track:
// one KeepAliveOnce for the lease the entry names, then a read of the entry.
func (d *Driver) renewUntracked(ctx context.Context, k string) error {
	id, fence, err := d.lookup(ctx, k)
	if err != nil {
		return storeErr("renew", err)
	}
	if _, err := d.cli.KeepAliveOnce(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return storeErr("renew", fmt.Errorf("%w: etcd lease %x not found", driver.ErrLeaseLost, int64(id)))
		}
		return storeErr("renew", err)
	}
	resp, err := d.cli.Get(ctx, k)
	if err != nil {
		return storeErr("renew", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != fence {
		return storeErr("renew", fmt.Errorf("%w: entry deleted", driver.ErrLeaseLost))
	}
	return nil
}

// Release deletes owner's entry only if its create revision is the grant's
// fence. The shared lease stays (other entries use it). It returns
// driver.ErrLeaseLost when the entry is not there.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return storeErr("release", err)
	}
	k := d.entry(key, owner)
	g := d.forget(k)
	var fence int64
	if g != nil {
		fence = g.fence
	} else {
		if d.isClosed() {
			return storeErr("release", driver.ErrClosed)
		}
		var err error
		if _, fence, err = d.lookup(ctx, k); err != nil {
			return storeErr("release", err)
		}
	}
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", fence)).
		Then(clientv3.OpDelete(k)).
		Commit()
	if err != nil {
		if g != nil {
			// The entry may still be on the shared lease, which other
			// entries keep alive: without this, it would stay held for
			// as long as they do, not end by its TTL. The lease's loop
			// deletes it (only while it is still on that lease, with
			// that create revision).
			d.mu.Lock()
			if !g.sl.gone {
				g.sl.orphans[k] = fence
			}
			d.mu.Unlock()
		}
		return storeErr("release", err)
	}
	if !resp.Succeeded {
		return storeErr("release", driver.ErrLeaseLost)
	}
	return nil
}

// errWaiterLost is wrapped when a waiter's own lease or entry dies.
var errWaiterLost = errors.New("the waiter's own etcd lease or entry is gone")

// Wait queues req's entry and waits, watching only the entry just before it
// (by create revision), until it is the lowest entry of the key. While it
// waits it confirms a keepalive of its shared lease every third of the
// lease TTL; when that lease dies or its entry is deleted, Wait returns an
// error matching driver.ErrLeaseLost. When ctx ends, it deletes its entry
// (or a grant that raced) with a fresh bounded context and returns an error
// matching ctx.Err().
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, storeErr("wait", driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("wait", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(driver.ErrClosed) })
	defer stop()

	octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
	q, err := d.enqueue(octx, req)
	ocancel()
	if err != nil {
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	if q.pred == "" {
		return d.granted(req, q)
	}
	k := d.entry(req.Key, req.Owner)
	fail := func(err error) (driver.Grant, error) {
		d.abandon(ctx, q.sl, k, q.rev)
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}

	dir := d.dir(req.Key)
	// Own entry: a delete means this waiter's lease died or the entry was
	// removed.
	ownCtx, ownCancel := context.WithCancel(ctx)
	defer ownCancel()
	ownCh := d.cli.Watch(ownCtx, k, clientv3.WithRev(q.rev+1), clientv3.WithFilterPut())

	keep := time.NewTicker(q.sl.ttl / 3)
	kept := &keeper{ttl: q.sl.ttl, last: time.Now()}
	defer keep.Stop()

	for {
		// Watch only the predecessor. Every entry ahead was created
		// before this one, and no entry can be created ahead of it later.
		predCtx, predCancel := context.WithCancel(ctx)
		// A watch from the current revision is served at once by etcd (one
		// from a past revision waits for its 100 ms catch-up loop); a
		// delete between the read and the watch's start is caught by
		// reading the predecessor again once the watch exists.
		predCh := d.cli.Watch(predCtx, q.pred, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
		deleted, err := d.waitDelete(ctx, q, predCh, &ownCh, keep.C, kept)
		predCancel()
		if err != nil {
			return fail(err)
		}
		if deleted && q.ahead == 1 {
			// The predecessor was the holder and the only entry ahead.
			return d.granted(req, q)
		}
		octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
		q2, err := d.ahead(octx, k, dir, q)
		ocancel()
		if err != nil {
			return fail(err)
		}
		q = q2
		if q.pred == "" {
			return d.granted(req, q)
		}
	}
}

// waitDelete returns (true, nil) when the predecessor's watch reports its
// delete, (false, nil) when the watch ended and the queue must be re-read,
// and an error when ctx ends, the own entry is deleted or the own lease
// cannot be kept alive.
func (d *Driver) waitDelete(ctx context.Context, q queued, predCh clientv3.WatchChan, ownCh *clientv3.WatchChan, keep <-chan time.Time, kept *keeper) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case resp, ok := <-predCh:
			if !ok || resp.Err() != nil {
				return false, nil // re-read
			}
			if resp.Created && resp.Header.Revision > q.seen {
				gctx, cancel := context.WithTimeout(ctx, d.opTimeout)
				g, err := d.cli.Get(gctx, q.pred, clientv3.WithKeysOnly())
				cancel()
				if err != nil {
					return false, err
				}
				if len(g.Kvs) == 0 {
					return true, nil
				}
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return true, nil
				}
			}
		case resp, ok := <-*ownCh:
			if !ok || resp.Err() != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				// The own watch ended (compaction): the keepalive and the
				// re-read still notice a dead lease or entry.
				*ownCh = nil
				return false, nil
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return false, fmt.Errorf("%w: %w", driver.ErrLeaseLost, errWaiterLost)
				}
			}
		case <-keep:
			sent := time.Now()
			kctx, cancel := context.WithTimeout(ctx, min(d.opTimeout, kept.ttl/3))
			err := q.sl.keepAlive(kctx) // shared with the lease's other users
			cancel()
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return false, fmt.Errorf("%w: %w", driver.ErrLeaseLost, errWaiterLost)
			}
			if err == nil {
				kept.last = sent
				continue
			}
			// One failed keepalive is retried at the next tick while the
			// lease has time left; past 2/3 of its TTL without one, the
			// store counts as unreachable.
			if ctx.Err() != nil || time.Since(kept.last) > kept.ttl*2/3 {
				return false, err
			}
		}
	}
}

// keeper tracks a waiter's last confirmed keepalive.
type keeper struct {
	ttl  time.Duration // the lease's TTL on the store
	last time.Time     // when the last confirmed keepalive was sent
}

func (d *Driver) waitErr(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, driver.ErrClosed) {
			return storeErr("wait", driver.ErrClosed)
		}
		return fmt.Errorf("etcddriver: wait %q: %w", key, ctx.Err())
	}
	return storeErr("wait", err)
}

// Inspect returns the holder of key (the entry with the lowest create
// revision), with the lease's remaining time (etcd's LeaseTimeToLive, in
// whole seconds) and the number of waiters, or driver.ErrNotAcquired when
// the key is free.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	resp, err := d.cli.Get(ctx, d.dir(key), append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...)
	if err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	if len(resp.Kvs) == 0 {
		return driver.HolderInfo{}, storeErr("inspect", driver.ErrNotAcquired)
	}
	kv := resp.Kvs[0]
	info := d.info(key, kv)
	info.Waiters = int(resp.Count) - 1
	if info.Remaining, err = d.remaining(ctx, kv); err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	return info, nil
}

// remaining asks etcd how long the lease of entry kv has left (whole
// seconds, as etcd counts them): zero for a lease that has ended, an
// error when etcd could not be asked (never a made-up zero, which would
// read as "about to expire").
func (d *Driver) remaining(ctx context.Context, kv *mvccpb.KeyValue) (time.Duration, error) {
	if kv.Lease == 0 {
		return 0, nil
	}
	ttl, err := d.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, nil
		}
		return 0, err
	}
	return max(time.Duration(ttl.TTL)*time.Second, 0), nil
}

func (d *Driver) info(key string, kv *mvccpb.KeyValue) driver.HolderInfo {
	var v value
	_ = json.Unmarshal(kv.Value, &v)
	return driver.HolderInfo{Key: key, Fence: uint64(kv.CreateRevision), Holder: v.Holder, TTL: v.TTL}
}

// List returns the held keys starting with prefix, sorted by key, each with
// its holder, its lease's remaining time (one LeaseTimeToLive per held key,
// up to 16 at once; zero for a lease that ended meanwhile) and its number of
// waiters.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	resp, err := d.cli.Get(ctx, d.locks+escapeKey(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, storeErr("list", err)
	}
	type held struct {
		kv    *mvccpb.KeyValue
		count int
	}
	byKey := map[string]*held{}
	for _, kv := range resp.Kvs {
		key, ok := d.keyOfEntry(string(kv.Key))
		if !ok || !strings.HasPrefix(key, prefix) {
			continue
		}
		h := byKey[key]
		if h == nil {
			h = &held{kv: kv}
			byKey[key] = h
		} else if kv.CreateRevision < h.kv.CreateRevision {
			h.kv = kv
		}
		h.count++
	}
	out := make([]driver.HolderInfo, 0, len(byKey))
	kvs := make([]*mvccpb.KeyValue, 0, len(byKey))
	for key, h := range byKey {
		info := d.info(key, h.kv)
		info.Waiters = h.count - 1
		out = append(out, info)
		kvs = append(kvs, h.kv)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make([]error, len(kvs))
	for i, kv := range kvs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			var err error
			if out[i].Remaining, err = d.remaining(ctx, kv); err != nil {
				errs[i] = err
			}
			<-sem
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, storeErr("list", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
