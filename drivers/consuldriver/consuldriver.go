// Package consuldriver is the dlock driver for Consul sessions and KV locks,
// using the official client github.com/hashicorp/consul/api.
//
// Open it by URL with dlock.Open (scheme "consul", registered in init):
//
//	consul://host:port[/prefix][?lock_delay=0s&behavior=delete&op_timeout=5s&dc=dc1&tls=false]
//
// or construct it directly with New over an *api.Client you already have
// (the driver never closes it). The prefix defaults to "dlock".
//
// # URL parameters
//
//   - lock_delay: Consul's lock-delay for every session the driver creates
//     (Options.LockDelay): 0, or 1 ms to 60 s. Default 0 (see "Lock-delay").
//   - behavior: what Consul does to a grant's entry when its session ends
//     without a release, "delete" (default) or "release" (Options.Behavior).
//   - op_timeout: bounds each round trip the driver makes on its own inside
//     Wait and its clean-ups (Options.OpTimeout). Default 5 s.
//   - dc: the datacenter to use (api.Config.Datacenter). Default: the
//     agent's own.
//   - tls: "true" to speak HTTPS to the agent. Default: HTTP, unless
//     CONSUL_HTTP_SSL says otherwise.
//
// # Credentials
//
// Open starts from api.DefaultConfig, the client's standard chain: the ACL
// token comes from CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE, TLS from
// CONSUL_CACERT, CONSUL_CAPATH, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY,
// CONSUL_TLS_SERVER_NAME and CONSUL_HTTP_SSL_VERIFY, basic auth from
// CONSUL_HTTP_AUTH. The URL's host replaces CONSUL_HTTP_ADDR. A token is
// never put in the URL. The token needs session:write on the agent's node
// and key:write on the prefix. The tests run a development agent with ACLs
// off, so they use no token.
//
// # Layout
//
// A key K is the KV entry <prefix>/.locks/<escaped K>; a waiter for K is the
// entry <prefix>/.queue/<escaped K>/<escaped owner>. Escaping keeps ASCII
// letters, digits, '-' and '_' and writes every other byte as %XX, so any
// key works, no escaped key contains '/' or starts with '.', and no prefix
// (whose path elements may not start with '.': ValidatePrefix) can lie
// inside another prefix's reserved .locks/ or .queue/ directory. An entry's
// value is JSON: the owner token, the holder description and the TTL.
//
// # Grants
//
// Every grant has a Consul session of its own, created with the lease's
// TTL, no health checks (a session bound to the agent's serfHealth check
// could be invalidated, and the key granted again, before its holder's
// deadline), the driver's lock-delay and behavior. TryAcquire reads the
// entry first (a held key costs one read and no write), then creates the
// session and takes the entry with a KV "lock" operation in a transaction.
// This is Consul's own leader-election and semaphore recipe
// (developer.hashicorp.com/consul/docs/dynamic-app-config/sessions and the
// "Application leader election" tutorial), with one session per grant.
//
// Renew renews the grant's session (PUT /v1/session/renew), then reads the
// entry to check that the session still holds it: a session Consul no
// longer knows, or an entry another session holds, is driver.ErrLeaseLost.
// Consul sessions keep the TTL they were created with, so Renew's ttl
// argument is not used. Release is one transaction, check-session and then
// delete (behavior delete) or unlock (behavior release) the entry, so a
// replayed release can never touch a newer grant; then the session is
// destroyed in the background (it holds nothing any more, so no lock-delay
// applies).
//
// # Fencing
//
// The fence of a grant is the Raft index at which Consul applied the
// transaction that took the entry: the ModifyIndex of the entry as the
// transaction returns it (the entry is never written again while held, so
// Inspect reads the same number). Raft indexes only grow, are never reused
// and survive restarts (they are in the fsynced log and its snapshots), and a
// later grant of a key is necessarily applied after the earlier one, so
// fences are strictly increasing per key for the life of the cluster.
//
// The entry's LockIndex is not used: it counts the grants of one entry and
// restarts at 1 whenever the entry is deleted, which behavior "delete" does
// at every expiry and Release does at every release (and an operator's
// "consul kv delete" at any time). It would repeat fences.
//
// # TTL and expiry
//
// The store owns expiry: the session's TTL timer runs on the Consul leader
// and is reset by each renewal, which is received after the client sent
// it, so the session never ends before the client-side validity deadline
// (sent + TTL − drift). Consul promises only that a session is not
// invalidated before its TTL; v1.16 invalidates it after twice the TTL, and a
// newly elected leader restarts every session's timer. Expiry can
// therefore come late (a dead holder's key is taken over between one and
// two TTLs after its last renewal), never early. Consul refuses TTLs
// shorter than the servers' session_ttl_min (10 s by default) or longer
// than 24 h; such a TTL is refused with driver.ErrInvalidTTL. Applications
// that need shorter leases lower session_ttl_min in the servers' config.
//
// # Lock-delay
//
// When Consul invalidates a session that holds an entry (TTL expiry,
// "consul session destroy", ForceRelease), it refuses to lock that entry
// again for the session's lock-delay. Consul's own default is 15 s; this
// driver's default is 0, because a dlock holder stops trusting its lease at
// its validity deadline, which Consul's TTL (late, never early) already
// respects, and fences reject a holder that was merely slow. A 15 s
// lock-delay would make every takeover after an expiry wait 15 s more (and
// would break the conformance timings). Set lock_delay for the extra
// protection of a pause after a holder's session is killed. A release by
// the holder never incurs lock-delay: the entry is released before the
// session is destroyed.
//
// # Capabilities
//
//   - driver.Waiter: a waiter creates its session, puts its queue entry
//     (locked by that session, so it goes when the waiter dies), and waits
//     by blocking queries, never polling: each waiter blocks on the queue
//     entry just before its own (in the order the entries were created,
//     by CreateIndex: FIFO), and the head of the queue blocks on the key's
//     entry; so a release wakes one waiter. The head takes the key and
//     deletes its queue entry in one transaction. A head refused while the
//     key is free (the key is in lock-delay, whose end Consul does not
//     tell) looks again after a growing pause, 50 ms to 1 s. While
//     waiting, the driver renews the waiter's session
//     every TTL/3; a renewal that fails ends the wait with a store error. A
//     cancelled waiter releases a grant that raced the cancellation,
//     deletes its queue entry and destroys its session, within the op
//     timeout. TryAcquire does not queue: it may take a free key ahead of a
//     queued waiter that has not yet been woken.
//   - driver.Inspector: Inspect and List read the entries and count the
//     queued waiters. HolderInfo.Remaining is 0 (unknown): Consul does not
//     tell a session's time left.
//   - driver.ForceReleaser: ForceRelease destroys the holder's session,
//     which releases (or deletes) the entry, with that session's
//     lock-delay.
//   - driver.Resumer: a session's TTL runs on the servers and any client
//     may renew it by ID, so a restarted process resumes its grant
//     (Locker.Resume): the entry checked for owner token and fence, then
//     its session renewed (see Resume).
//   - Grant.Lost is not set: loss is found by the next renewal or the
//     validity deadline.
//
// # What Consul cannot promise
//
//   - Expiry is late by up to one TTL (above).
//   - Reads of the entry (the pre-check, Renew's check, Inspect) use
//     Consul's default consistency mode, served by the leader without a
//     quorum round; grants, releases and session changes go through Raft.
//     During a leader change a read may be stale, which can delay a grant
//     or make Renew report a loss the next renewal would not; it can never
//     grant a held key (the transaction decides).
//   - A session's TTL timer lives in the leader's memory: a cluster that has
//     lost its quorum expires nothing and grants nothing.
//   - A session belongs to the node of the agent that created it. When that
//     node leaves the catalog (a client agent stopped with
//     leave_on_terminate, which is the default for client agents; "consul
//     force-leave"; a failed node reaped after 72 h), Consul invalidates its
//     sessions at once: grants end before their holders' deadlines, and
//     another client may be granted while a holder still trusts its lease
//     until its next renewal (at most TTL/3 later). Fences reject that
//     holder's late writes. Point the driver at server agents, or at client
//     agents that do not leave (leave_on_terminate = false). The sessions
//     have no health checks, so a failing check never ends a grant.
//   - Anyone with key:write on the prefix can delete an entry; the holder
//     then finds the loss at its next renewal, and the fence still grows.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the consul section of docs/GUARANTEES.md holds the figures, for
// one Consul server agent (session_ttl_min lowered to 100 ms for the 1 s TTL
// of the runs). make verify regenerates them.
package consuldriver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("consul", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return open(ctx, u)
	})
}

// Behaviors of a session whose TTL runs out (Options.Behavior).
const (
	// BehaviorDelete deletes the grant's entry when its session ends
	// without a release. It is the default: free keys leave nothing behind.
	BehaviorDelete = api.SessionBehaviorDelete
	// BehaviorRelease keeps the entry and clears its session; free keys stay
	// in the KV store, one entry each.
	BehaviorRelease = api.SessionBehaviorRelease
)

// MaxLockDelay is the longest lock-delay Consul accepts.
const MaxLockDelay = 60 * time.Second

// DefaultPrefix is the KV prefix used when Options.Prefix is empty.
const DefaultPrefix = "dlock"

const defaultOpTimeout = 5 * time.Second

// Options configure a Driver. A nil *Options selects every default.
type Options struct {
	// Prefix is the KV prefix under which the driver keeps its entries (in
	// Prefix + "/.locks/" and Prefix + "/.queue/"); leading and trailing
	// "/" are dropped. See ValidatePrefix. Zero value: "dlock".
	Prefix string
	// Behavior is what Consul does with a grant's entry when its session
	// ends without a release: BehaviorDelete or BehaviorRelease. Fences do
	// not depend on it. Zero value: BehaviorDelete.
	Behavior string
	// LockDelay is the lock-delay of every session the driver creates: 0,
	// or 1 ms to MaxLockDelay (see "Lock-delay" in the package doc). Zero
	// value: 0, no lock-delay.
	LockDelay time.Duration
	// OpTimeout bounds each round trip the driver makes on its own inside
	// Wait (session, queue entry, renewals, reads) and the clean-up after a
	// cancelled wait or a release. Zero value: 5 s.
	OpTimeout time.Duration
}

// Driver is a dlock driver over one Consul API client. It implements
// driver.Driver, driver.Waiter, driver.Inspector, driver.ForceReleaser and
// driver.Resumer, and is safe for concurrent use.
type Driver struct {
	kv        *api.KV
	txn       *api.Txn
	sess      *api.Session
	raw       *api.Raw
	transport *http.Transport // ours (Open): idle connections closed by Close
	prefix    string
	locks     string // prefix + "/.locks/"
	queue     string // prefix + "/.queue/"
	behavior  string
	lockDelay time.Duration
	opTimeout time.Duration

	closeCtx    context.Context // cancelled when Close starts: ends waits
	closeCancel context.CancelFunc
	abortCtx    context.Context // cancelled closeGrace later: ends background work
	abortCancel context.CancelFunc
	wg          sync.WaitGroup // background session destroys

	mu       sync.Mutex
	closed   bool
	sessions map[string]*grantSession // by owner token
}

// grantSession is the session of a grant made through this driver.
type grantSession struct {
	id      string
	ttl     time.Duration
	touched time.Time // last grant or renewal
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Waiter        = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.ForceReleaser = (*Driver)(nil)
)

// ValidatePrefix returns nil when p is a valid prefix: at most 256 bytes of
// UTF-8 after trimming "/", no empty path element ("a//b"), no element
// that starts with "." (those names are reserved for the driver), no
// control character. The empty string selects DefaultPrefix. Otherwise it
// returns an error matching driver.ErrInvalidArgument.
func ValidatePrefix(p string) error {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	if len(p) > 256 {
		return urlparam.Invalid("consuldriver: prefix of %d bytes, longer than 256", len(p))
	}
	if err := driver.CheckHolder(p); err != nil {
		return urlparam.Invalid("consuldriver: prefix %q: %v", p, err)
	}
	for _, el := range strings.Split(p, "/") {
		if el == "" {
			return urlparam.Invalid("consuldriver: prefix %q has an empty path element", p)
		}
		if strings.HasPrefix(el, ".") {
			return urlparam.Invalid("consuldriver: prefix %q: path element %q starts with '.', reserved for the driver", p, el)
		}
	}
	return nil
}

func checkOptions(o *Options) error {
	if err := ValidatePrefix(o.Prefix); err != nil {
		return err
	}
	switch o.Behavior {
	case "", BehaviorDelete, BehaviorRelease:
	default:
		return urlparam.Invalid("consuldriver: behavior %q, want %q or %q", o.Behavior, BehaviorDelete, BehaviorRelease)
	}
	if o.LockDelay != 0 && (o.LockDelay < time.Millisecond || o.LockDelay > MaxLockDelay) {
		return urlparam.Invalid("consuldriver: lock-delay %v, want 0 or 1ms to %v", o.LockDelay, MaxLockDelay)
	}
	if o.OpTimeout < 0 {
		return urlparam.Invalid("consuldriver: negative op timeout %v", o.OpTimeout)
	}
	return nil
}

// New returns a driver over client. It never closes client and does no
// I/O. opts may be nil. It returns an error matching
// driver.ErrInvalidArgument when an option is invalid.
func New(client *api.Client, opts *Options) (*Driver, error) {
	if client == nil {
		return nil, urlparam.Invalid("consuldriver: nil client")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := checkOptions(&o); err != nil {
		return nil, err
	}
	return newDriver(client, nil, o), nil
}

func newDriver(client *api.Client, transport *http.Transport, o Options) *Driver {
	o.Prefix = strings.Trim(o.Prefix, "/")
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Behavior == "" {
		o.Behavior = BehaviorDelete
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = defaultOpTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	actx, acancel := context.WithCancel(context.Background())
	return &Driver{
		kv: client.KV(), txn: client.Txn(), sess: client.Session(), raw: client.Raw(),
		transport: transport,
		prefix:    o.Prefix,
		locks:     o.Prefix + "/" + locksDir + "/",
		queue:     o.Prefix + "/" + queueDir + "/",
		behavior:  o.Behavior, lockDelay: o.LockDelay, opTimeout: o.OpTimeout,
		closeCtx: ctx, closeCancel: cancel,
		abortCtx: actx, abortCancel: acancel,
		sessions: map[string]*grantSession{},
	}
}

// Open connects to the Consul agent named by u,
// consul://host:port[/prefix][?params] (see the package doc), with the
// client's standard configuration chain for credentials and TLS. The port
// is required (an agent's HTTP port, 8500 by default, is not assumed). Open
// asks the agent for the cluster's leader once and returns an error
// wrapping driver.ErrUnavailable when it does not answer or knows no
// leader, or matching driver.ErrPermissionDenied when it refuses the
// token. An invalid URL (another scheme, no host, no port, an unknown or
// malformed parameter, an invalid prefix) returns an error matching
// driver.ErrInvalidArgument.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, urlparam.Wrap("consuldriver", err)
	}
	return open(ctx, u)
}

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != "consul" {
		return nil, urlparam.Invalid("consuldriver: URL scheme %q, want consul", u.Scheme)
	}
	const shape = "consul://HOST:PORT[/prefix]"
	if err := urlparam.Addrs("consuldriver", u.Host, shape, true); err != nil {
		return nil, err
	}
	if strings.Contains(u.Host, ",") {
		return nil, urlparam.Invalid("consuldriver: URL host %q names several agents; name one (want %s)", u.Host, shape)
	}
	if u.User != nil {
		return nil, urlparam.Invalid("consuldriver: the URL has user information; put credentials in CONSUL_HTTP_TOKEN (or CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_AUTH), never in the URL")
	}
	q := u.Query()
	if err := urlparam.Known("consuldriver", q, "lock_delay", "behavior", "op_timeout", "dc", "tls"); err != nil {
		return nil, err
	}
	o := Options{Prefix: u.Path, Behavior: q.Get("behavior")}
	if v := q.Get("lock_delay"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, urlparam.Invalid("consuldriver: URL parameter lock_delay=%q is not a duration", v)
		}
		o.LockDelay = d
	}
	if err := urlparam.Durations(q, map[string]*time.Duration{"op_timeout": &o.OpTimeout}); err != nil {
		return nil, urlparam.Wrap("consuldriver", err)
	}
	if err := checkOptions(&o); err != nil {
		return nil, err
	}
	cfg := api.DefaultConfig()
	cfg.Address = u.Host
	cfg.Datacenter = q.Get("dc")
	if v := q.Get("tls"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, urlparam.Invalid("consuldriver: URL parameter tls=%q is not a boolean", v)
		}
		cfg.Scheme = "http"
		if on {
			cfg.Scheme = "https"
		}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, urlparam.Wrap("consuldriver: client configuration", err)
	}
	d := newDriver(client, cfg.Transport, o)
	pctx, cancel := context.WithTimeout(ctx, d.opTimeout)
	defer cancel()
	leader, err := client.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(pctx))
	if err != nil {
		d.Close()
		var se api.StatusError
		switch {
		case permissionText(err.Error()):
			return nil, d.storeErr("connect "+u.Host, err)
		case errors.As(err, &se) && se.Code == http.StatusNotFound:
			return nil, urlparam.Wrap("consuldriver: the server at "+u.Host+" has no Consul HTTP API (is it a Consul agent? check the URL's port)", err)
		case refused(err):
			return nil, d.storeErr("connect "+u.Host, err)
		case strings.Contains(err.Error(), "malformed HTTP"), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"),
			strings.Contains(err.Error(), "first record does not look like a TLS handshake"):
			return nil, urlparam.Wrap("consuldriver: the server at "+u.Host+" does not speak Consul's HTTP API (check the URL's port and tls)", err)
		}
		return nil, fmt.Errorf("consuldriver: connect %s: %w: %w", u.Host, driver.ErrUnavailable, err)
	}
	if leader == "" {
		d.Close()
		return nil, fmt.Errorf("consuldriver: connect %s: %w: the agent knows no cluster leader", u.Host, driver.ErrUnavailable)
	}
	return d, nil
}

// refused reports whether err is an answer in which Consul refused the
// request itself (a 4xx status, an ACL refusal), not an outage.
func refused(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code >= 400 && se.Code < 500 && se.Code != http.StatusTooManyRequests
	}
	return permissionText(err.Error())
}

func permissionText(s string) bool {
	return strings.Contains(s, "Permission denied") || strings.Contains(s, "ACL not found") || strings.Contains(s, "ACL support disabled")
}

// storeErr wraps an error of op. An ACL refusal matches
// driver.ErrPermissionDenied, a refused TTL driver.ErrInvalidTTL, any
// other 4xx answer driver.ErrInvalidArgument; everything else (no answer, a
// 5xx, no leader) is a plain store error, which the root package reports
// as ErrUnavailable.
func (d *Driver) storeErr(op string, err error) error {
	msg := err.Error()
	switch {
	case permissionText(msg):
		return fmt.Errorf("consuldriver: %s: %w: %w", op, driver.ErrPermissionDenied, err)
	case strings.Contains(msg, "Invalid Session TTL"):
		return fmt.Errorf("consuldriver: %s: %w: Consul refused the session TTL (outside the servers' session_ttl_min, 10s by default, to 24h): %w", op, driver.ErrInvalidTTL, err)
	case refused(err):
		return urlparam.Wrap("consuldriver: "+op+": Consul refused the request", err)
	}
	return fmt.Errorf("consuldriver: %s: %w", op, err)
}

func (d *Driver) lockKey(key string) string { return d.locks + escapeKey(key) }

func (d *Driver) queueDirOf(key string) string { return d.queue + escapeKey(key) + "/" }

func (d *Driver) queueKey(key, owner string) string { return d.queueDirOf(key) + escapeKey(owner) }

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// read returns the entry of k (nil when missing) and the index to block on.
func (d *Driver) read(ctx context.Context, k string) (*api.KVPair, uint64, error) {
	kv, meta, err := d.kv.Get(k, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, 0, err
	}
	return kv, meta.LastIndex, nil
}

// createSession creates the session of one grant (or wait): the lease's
// TTL, no health checks, the driver's behavior and lock-delay.
func (d *Driver) createSession(ctx context.Context, ttl time.Duration) (string, error) {
	body := map[string]any{
		"Name":          "dlock",
		"TTL":           ttl.String(),
		"Behavior":      d.behavior,
		"LockDelay":     d.lockDelay.String(),
		"Checks":        []string{},
		"NodeChecks":    []string{},
		"ServiceChecks": []string{},
	}
	var out struct{ ID string }
	if _, err := d.raw.Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return "", d.storeErr("create session", err)
	}
	if out.ID == "" {
		return "", fmt.Errorf("consuldriver: create session: Consul returned no session ID")
	}
	return out.ID, nil
}

// destroyLater destroys a session in the background, bounded by the op
// timeout; Close waits for it (and cuts it short after closeGrace).
func (d *Driver) destroyLater(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return // it expires by its TTL
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.abortCtx, d.opTimeout)
		defer cancel()
		_, _ = d.sess.Destroy(id, (&api.WriteOptions{}).WithContext(ctx))
	}()
}

// txnErrors joins a refused transaction's errors into one message.
func txnErrors(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "transaction refused"
	}
	msgs := make([]string, len(resp.Errors))
	for i, e := range resp.Errors {
		msgs[i] = e.What
	}
	return strings.Join(msgs, "; ")
}

// errLockDelay is lockTxn's refusal of a key in lock-delay. It matches
// driver.ErrNotAcquired.
var errLockDelay = fmt.Errorf("%w: the key is in lock-delay", driver.ErrNotAcquired)

// lockTxn takes lockKey for session id, and deletes alsoDelete (a queue
// entry) in the same transaction when it is not empty. It returns the
// fence (the transaction's Raft index), or ErrNotAcquired when the entry is
// held (errLockDelay, which matches it, when it is in lock-delay).
func (d *Driver) lockTxn(ctx context.Context, lockKey, id string, value []byte, alsoDelete string) (uint64, error) {
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: lockKey, Value: value, Session: id}}}
	if alsoDelete != "" {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: alsoDelete}})
	}
	ok, resp, _, err := d.txn.Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, d.storeErr("acquire", err)
	}
	if !ok {
		msg := txnErrors(resp)
		switch {
		case strings.Contains(msg, "lock delay"):
			return 0, errLockDelay
		case strings.Contains(msg, "already held"):
			return 0, driver.ErrNotAcquired
		case permissionText(msg):
			return 0, fmt.Errorf("consuldriver: acquire: %w: %s", driver.ErrPermissionDenied, msg)
		}
		return 0, fmt.Errorf("consuldriver: acquire: Consul refused the transaction: %s", msg)
	}
	if len(resp.Results) == 0 || resp.Results[0].KV == nil || resp.Results[0].KV.ModifyIndex == 0 {
		return 0, fmt.Errorf("consuldriver: acquire: the transaction returned no entry")
	}
	return resp.Results[0].KV.ModifyIndex, nil
}

// remember records owner's grant session, and forgets sessions of grants
// neither renewed nor released for three TTLs (their sessions have ended
// on the store: a later call for them reads the entry instead).
func (d *Driver) remember(owner, id string, ttl time.Duration) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for o, s := range d.sessions {
		if now.Sub(s.touched) > 3*s.ttl+time.Minute {
			delete(d.sessions, o)
		}
	}
	d.sessions[owner] = &grantSession{id: id, ttl: ttl, touched: now}
}

func (d *Driver) forget(owner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.sessions, owner)
}

// sessionOf returns the session of owner's grant on key: the one recorded
// at grant, else the one holding the entry when the entry names owner. ""
// means owner holds nothing there.
func (d *Driver) sessionOf(ctx context.Context, key, owner string) (string, error) {
	d.mu.Lock()
	s := d.sessions[owner]
	d.mu.Unlock()
	if s != nil {
		return s.id, nil
	}
	kv, _, err := d.read(ctx, d.lockKey(key))
	if err != nil {
		return "", err
	}
	if kv == nil || kv.Session == "" {
		return "", nil
	}
	if r, ok := decodeRecord(kv.Value); ok && r.Owner == owner {
		return kv.Session, nil
	}
	return "", nil
}

// TryAcquire implements driver.Driver: a read of the entry (a held key
// answers ErrNotAcquired without writing), then a session and a lock
// transaction. A failed attempt destroys its session in the background.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("consuldriver: acquire: %w", err)
	}
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	lk := d.lockKey(req.Key)
	kv, _, err := d.read(ctx, lk)
	if err != nil {
		return driver.Grant{}, d.storeErr("acquire", err)
	}
	if kv != nil && kv.Session != "" {
		return driver.Grant{}, driver.ErrNotAcquired
	}
	id, err := d.createSession(ctx, req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	// Known before the transaction, so that a Release for this owner (the
	// root package's clean-up after an error) finds the session even when
	// the transaction's answer is lost.
	d.remember(req.Owner, id, req.TTL)
	fence, err := d.lockTxn(ctx, lk, id, encodeRecord(req.Owner, req.Holder, req.TTL), "")
	if err != nil {
		d.forget(req.Owner)
		// Destroying the session releases the entry if the transaction
		// did take it after all.
		d.destroyLater(id)
		return driver.Grant{}, err
	}
	return driver.Grant{Fence: fence}, nil
}

// Renew implements driver.Driver: it renews the grant's session, then
// checks that the session still holds the entry. The ttl argument is not
// used (a Consul session keeps the TTL it was created with).
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("consuldriver: renew: %w", err)
	}
	if d.isClosed() {
		return driver.ErrClosed
	}
	id, err := d.sessionOf(ctx, key, owner)
	if err != nil {
		return d.storeErr("renew", err)
	}
	if id == "" {
		return driver.ErrLeaseLost
	}
	entry, _, err := d.sess.Renew(id, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return d.storeErr("renew", err)
	}
	if entry == nil { // 404: the session has ended
		d.forget(owner)
		return driver.ErrLeaseLost
	}
	kv, _, err := d.read(ctx, d.lockKey(key))
	if err != nil {
		return d.storeErr("renew", err)
	}
	if kv == nil || kv.Session != id {
		d.forget(owner)
		d.destroyLater(id)
		return driver.ErrLeaseLost
	}
	d.mu.Lock()
	if s := d.sessions[owner]; s != nil {
		s.touched = time.Now()
	}
	d.mu.Unlock()
	return nil
}

// releaseOps returns the transaction that releases lockKey if, and only
// if, session id holds it.
func (d *Driver) releaseOps(lockKey, id string) api.TxnOps {
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: lockKey, Session: id}}}
	if d.behavior == BehaviorRelease {
		return append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: lockKey, Session: id}})
	}
	return append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: lockKey}})
}

// Release implements driver.Driver: one transaction that checks the
// grant's session still holds the entry and deletes (or unlocks) it; then
// the session is destroyed in the background.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("consuldriver: release: %w", err)
	}
	if d.isClosed() {
		return driver.ErrClosed
	}
	id, err := d.sessionOf(ctx, key, owner)
	if err != nil {
		return d.storeErr("release", err)
	}
	if id == "" {
		return driver.ErrLeaseLost
	}
	ok, resp, _, err := d.txn.Txn(d.releaseOps(d.lockKey(key), id), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return d.storeErr("release", err)
	}
	d.forget(owner)
	d.destroyLater(id)
	if !ok {
		if msg := txnErrors(resp); permissionText(msg) {
			return fmt.Errorf("consuldriver: release: %w: %s", driver.ErrPermissionDenied, msg)
		}
		return driver.ErrLeaseLost
	}
	return nil
}

// closeGrace is how long Close lets background session destroys finish
// before it interrupts them (an interrupted destroy costs nothing: the
// session, which holds nothing, expires by its TTL).
const closeGrace = 100 * time.Millisecond

// Close ends pending waits (each cleans up after itself within the op
// timeout before it returns), gives background session destroys closeGrace
// to finish, and closes the idle connections of the client Open created,
// so it returns promptly even when the store does not answer. Grants stay
// on the store and expire with their sessions. Closing twice returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.closeCancel()
	done := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeGrace):
	}
	d.abortCancel()
	<-done
	if d.transport != nil {
		d.transport.CloseIdleConnections()
	}
	return nil
}
