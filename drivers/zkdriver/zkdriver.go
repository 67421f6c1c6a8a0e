// Package zkdriver is the dlock driver for Apache ZooKeeper, using
// github.com/go-zookeeper/zk.
//
// Open it by URL with dlock.Open (scheme "zk", registered in init):
//
//	zk://host:port[,host:port…]/root[?session_timeout=4s&op_timeout=5s]
//
// Every server names its host (an empty host is an error at Open, never
// localhost); a server without a port uses ZooKeeper's 2181, as
// go-zookeeper does, and "host:" with an empty port is an error. The root
// path defaults to "/dlock"; it and its child "/.locks" are
// created (persistent) when missing. A root with a path element starting
// with "." is refused (see "Roots" below).
//
// # The lock recipe
//
// This is ZooKeeper's own lock recipe ("ZooKeeper Recipes and Solutions",
// Locks). A key K is the container node <root>/.locks/<escaped K> (see
// escapeKey: everything outside printable ASCII, and "%", "/" and ".", is
// percent-escaped, so any valid key works, "/" included; ZooKeeper deletes
// empty container nodes by itself). Every acquisition attempt creates one
// ephemeral sequential child "<owner token>-<sequence>" in it. The holder of
// K is the child with the lowest sequence number; the others wait, each
// watching only the child just before its own (no herd, FIFO).
//
// # Roots
//
// Drivers with different roots are independent, whatever the roots: "/team"
// and "/team/app" (nested), or "/team" and "/team2". Key nodes live only
// under the reserved child <root>/.locks, and a root may not have a path
// element that starts with "." (Open returns an error), so no root can lie
// inside another root's .locks node, and no escaped key (in which every "."
// is escaped) can be a reserved name. Other children of the root are never
// read.
//
// # Upgrading from the layout without .locks
//
// Versions before the .locks node kept K's container at <root>/<escaped K>,
// where a driver on "/team" took the nodes of a driver on "/team/app" for
// holders of its key "app" (and waited for them until ZooKeeper removed the
// empty containers). Old and new clients do not see each other's nodes, so
// they must not run side by side on the same root: during a rolling upgrade
// each side would grant a key the other holds. Stop every old client of a
// root (or wait until none holds or waits for a key: no child of the root
// other than .locks has children) before starting new ones. Nothing needs
// to be deleted: old lock nodes are ephemeral and go with their sessions,
// and their empty containers are removed by ZooKeeper. Fences (creation
// zxids) keep increasing across the upgrade.
//
// # Fencing
//
// The fencing token of a grant is the creation zxid (Czxid) of the holder's
// node. The zxid is ZooKeeper's transaction id: it only grows for the life
// of the ensemble (across restarts and leader changes, the epoch is in its
// high 32 bits) and is never reused; a holder's node was created after every
// earlier holder's node of the same key, so fences strictly increase.
//
// The create is a multi that also sets the key node's (empty) data, whose
// answer carries the key node's stat in the same transaction: when the new
// node is the key's only child (every uncontended acquisition), it holds
// the key, and the key node's pzxid is that transaction's zxid, the node's
// czxid, so neither the queue listing nor the node's stat is read (two round
// trips per acquisition, create and delete, as a bare create would take).
// Otherwise the queue is listed; a node that is its key's only child by
// then takes the listing's pzxid, which spares a round trip to read the
// node's stat: it is the node's czxid unless another client created and
// deleted a node of the key in between, and in every case greater than
// every earlier holder's fence and smaller than every later holder's (see
// onlyChildFence). Inspect and List report the holder node's czxid, which
// in that race is lower than the grant's fence (still above the earlier
// holders').
//
// # Sessions, TTL and loss
//
// The store owns expiry through the ZooKeeper session: the server deletes
// every ephemeral node of a session once it has not heard from the client
// for the session timeout (URL parameter session_timeout, default 4 s; the
// server clamps it to [2, 20] × its tickTime unless configured otherwise).
// The lease TTL given to dlock does not reach ZooKeeper: it only sets the
// client's validity deadline (sent + TTL − drift) and the heartbeat
// (TTL/3). Renew asks the server whether the node still exists and belongs
// to the current session; it answers driver.ErrLeaseLost otherwise.
//
// Loss is pushed (Grant.Lost) for every grant of a connection at once when
// the session expires, and also when the connection to the server is lost:
// at once when the connection breaks (a reset, a closed socket), and after
// 2/3 of the session timeout without a packet from the server (the client
// library's declaration), even when the client reconnects within the
// session at once. That is more conservative than the session needs, but the
// driver cannot know, while disconnected, whether the session will
// survive. The server cannot expire the session, and so
// cannot hand the key to someone else, before the session timeout has
// passed since it last heard from the client, so the client always knows
// first, whatever the TTL, as long as the client process is not paused and
// clocks run at about the same rate. Nodes of grants given up this way are
// deleted as soon as the same session is back; if it expired instead, the
// server has deleted them already. After a reconnect with a new session the
// driver never adopts a node of an old session as its own: Renew and Release
// check the node's ephemeralOwner against the current session id.
//
// The driver follows the connection's own state (go-zookeeper's State and
// SessionID, and a count of ended connected periods kept by an event
// callback, which the library calls for every event), never only the
// library's event channel, which drops events when its small buffer is
// full: a driver that missed the new session after an expiry would stay
// without one for good, and one that missed the expiry would keep the
// grants of a session that is gone. Every call reconciles with that state
// first, and so does a loop woken by each session event (which pushes loss
// and deletes orphans when no call comes).
//
// # Capabilities
//
//   - driver.Waiter: each waiter watches only its predecessor (FIFO, no
//     herd); a waiter whose session or connection is lost stops with a
//     store error; a cancelled waiter deletes its node.
//   - Pushed loss: Grant.Lost is shared by every grant of one connected
//     period of one session, and closes when it ends.
//   - driver.Inspector: Inspect and List (Remaining is always zero).
//   - driver.SharedLocker: read-write locks (Curator's
//     InterProcessReadWriteLock; Shared with Limit 0 and Exclusive; no
//     counted permits), whose Exclusive grants are plain locks of the same
//     key (see SharedView in shared.go).
//   - No driver.Resumer (dlock's Locker.Resume answers ErrUnsupported): a
//     grant is an ephemeral node owned by the ZooKeeper session that
//     created it, and this driver declares the grants of a session lost
//     when its connection drops, so a grant cannot pass to another process
//     (re-attaching to the session by ID and password would also take over
//     every other grant of that session, and the driver never exports them).
//
// # Unrenewed grants
//
// A session can outlive the lease: the process keeps its connection but its
// renewals stop being confirmed (a slow or overloaded server), and the dlock
// root package declares the lease lost at its validity deadline. So that
// the key is not then held for the life of the session, the driver deletes
// a grant's node once its TTL has passed since the grant or the last
// confirmed Renew (never before the root's deadline, which is that minus
// drift), as a store-side TTL would.
//
// # Contexts
//
// go-zookeeper's calls take no context. Every call here runs the library
// call in a goroutine and returns when the context ends; a node created by a
// call that the caller abandoned is deleted when the call completes.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the zookeeper sections of docs/GUARANTEES.md hold the figures,
// for one standalone server. make verify regenerates them.
package zkdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("zk", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return Open(ctx, u, nil)
	})
}

// Defaults of the URL parameters.
const (
	DefaultRoot           = "/dlock"
	DefaultSessionTimeout = 4 * time.Second
	DefaultOpTimeout      = 5 * time.Second
)

// Options configure Open beyond the URL. A nil *Options selects every
// default.
type Options struct {
	// Dialer, when set, replaces net.DialTimeout for connections to the
	// servers (tests use it to cut a client off). Zero value: net.DialTimeout.
	Dialer zk.Dialer
}

// Driver is a dlock driver over one ZooKeeper session (one zk.Conn, which
// reconnects by itself). It is safe for concurrent use.
type Driver struct {
	conn           *zk.Conn
	root           string
	sessionTimeout time.Duration
	opTimeout      time.Duration

	closeCtx    context.Context
	closeCancel context.CancelFunc
	wg          sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	cur       *generation // nil while there is no session
	ready     chan struct{}
	readyOnce sync.Once
	orphans   map[string]int64     // node path → session: to delete when that session is back
	suspects  map[[2]string]int64  // {dir, owner} of an ambiguous create → session
	grants    map[string]grantInfo // by key + "\x00" + owner
	expiries  map[string]*expiry   // by key + "\x00" + owner, for grants

	// ends counts the connected periods that have ended (session events
	// StateDisconnected and StateExpired), counted by onEvent.
	ends atomic.Uint64
	// kick wakes the run loop after a session event; it holds at most
	// one wake-up, so that onEvent never blocks.
	kick chan struct{}
	// runHook, when set (by tests only), is called by the run loop before
	// each reconciliation: a run loop that has fallen behind.
	runHook atomic.Pointer[func()]
}

// expiry ends a grant that is not renewed within its TTL while the session
// lives on.
type expiry struct {
	timer   *time.Timer
	until   time.Time // last confirmed renewal (or grant) + TTL
	path    string
	version int32
}

// generation is one connected period of one session. Grants made in it are
// lost together when it ends (disconnect or expiry).
type generation struct {
	session int64
	ends    uint64 // Driver.ends when it started
	lost    chan struct{}
	nodes   map[string]struct{} // nodes created in it and not yet deleted
}

type grantInfo struct {
	path    string
	czxid   int64
	version int32
	gen     *generation
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Waiter    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
)

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// Open connects to the ensemble named by u,
// zk://host:port[,host:port…]/root, with the optional query parameters
// session_timeout and op_timeout (Go durations). It waits, within ctx, until
// the first session is established and the root exists, and returns an
// error wrapping driver.ErrUnavailable when that fails. An invalid URL
// (another scheme, no host, an empty host or port, a port outside 1..65535, an unknown or
// malformed parameter, a reserved root) returns an error matching
// driver.ErrInvalidArgument instead. opts may be nil.
func Open(ctx context.Context, u *url.URL, opts *Options) (*Driver, error) {
	if u.Scheme != "zk" {
		return nil, urlparam.Invalid("zkdriver: URL scheme %q, want zk", u.Scheme)
	}
	if err := urlparam.Addrs("zkdriver", u.Host, "zk://HOST[:PORT][,HOST[:PORT]…]/root", false); err != nil {
		return nil, err
	}
	q := u.Query()
	if err := urlparam.Known("zkdriver", q, "session_timeout", "op_timeout"); err != nil {
		return nil, err
	}
	d := &Driver{
		root: strings.TrimRight(u.Path, "/"), sessionTimeout: DefaultSessionTimeout, opTimeout: DefaultOpTimeout,
		ready: make(chan struct{}), orphans: map[string]int64{}, suspects: map[[2]string]int64{}, grants: map[string]grantInfo{},
		expiries: map[string]*expiry{}, kick: make(chan struct{}, 1),
	}
	if d.root == "" {
		d.root = DefaultRoot
	}
	if err := validateRoot(d.root); err != nil {
		return nil, err
	}
	if err := urlparam.Durations(q, map[string]*time.Duration{"session_timeout": &d.sessionTimeout, "op_timeout": &d.opTimeout}); err != nil {
		return nil, urlparam.Wrap("zkdriver", err)
	}
	servers := urlparam.Hosts(u.Host)
	dialer := zk.Dialer(net.DialTimeout)
	if opts != nil && opts.Dialer != nil {
		dialer = opts.Dialer
	}
	// The event channel Connect returns is not read: go-zookeeper drops
	// events when its small buffer is full (see reconcileLocked).
	conn, _, err := zk.Connect(servers, d.sessionTimeout, zk.WithLogger(nopLogger{}), zk.WithLogInfo(false), zk.WithDialer(dialer),
		zk.WithEventCallback(d.onEvent))
	if err != nil {
		return nil, fmt.Errorf("zkdriver: connect %s: %w: %w", u.Host, driver.ErrUnavailable, err)
	}
	d.conn = conn
	d.closeCtx, d.closeCancel = context.WithCancel(context.Background())
	d.wg.Add(1)
	go d.run()

	fail := func(err error) (*Driver, error) {
		d.Close()
		if refused(err) {
			return nil, urlparam.Wrap("zkdriver: open "+u.Host+": ZooKeeper refused the request", err)
		}
		return nil, fmt.Errorf("zkdriver: open %s: %w: %w", u.Host, driver.ErrUnavailable, err)
	}
	// The first session may take a reconnect (go-zookeeper waits 1 s
	// between rounds of the server list).
	octx, cancel := context.WithTimeout(ctx, max(d.opTimeout, d.sessionTimeout)+time.Second)
	defer cancel()
	select {
	case <-d.ready:
	case <-octx.Done():
		return fail(fmt.Errorf("no session: %w", octx.Err()))
	}
	// Create the root and its .locks node, one level at a time.
	parts := append(strings.Split(strings.Trim(d.root, "/"), "/"), locksDir)
	for i := range parts {
		p := "/" + strings.Join(parts[:i+1], "/")
		_, err := do(octx, d, func() (string, error) { return d.conn.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fail(fmt.Errorf("create %s: %w", p, err))
		}
	}
	return d, nil
}

// onEvent is go-zookeeper's event callback, called synchronously by the
// library's goroutines for every event, never dropped. It must not block
// them: it only counts the end of a connected period and wakes the run loop
// (a wake-up already pending covers this event too, since the run loop
// reads the state after taking it).
func (d *Driver) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	if ev.State == zk.StateDisconnected || ev.State == zk.StateExpired {
		d.ends.Add(1)
	}
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run reconciles the generation with the connection after every session
// event, so that loss is pushed and orphans are deleted without waiting for
// the next call, until the driver is closed.
func (d *Driver) run() {
	defer d.wg.Done()
	for {
		select {
		case <-d.closeCtx.Done():
			d.mu.Lock()
			d.endLocked()
			d.mu.Unlock()
			return
		case <-d.kick:
		}
		if h := d.runHook.Load(); h != nil {
			(*h)()
		}
		d.mu.Lock()
		d.reconcileLocked()
		d.mu.Unlock()
	}
}

// reconcileLocked brings d.cur in line with the connection's real state,
// which go-zookeeper publishes atomically (State, SessionID) before it
// reports an event, and with the count of ended connected periods. It never
// trusts that an event was seen: go-zookeeper's event channel drops events
// when its buffer (6) is full, and a run loop that missed the StateHasSession
// after a reconnect would leave the driver without a session for good, one
// that missed the expiry would keep using a generation whose session is
// gone. The current generation ends (its grants are lost) when its
// connected period has ended or the connection's session is another; a new
// one starts when the connection has a session and the driver has none.
// Nodes of an expired session are never adopted: a generation only has the
// connection's session, and nodes are checked against it.
func (d *Driver) reconcileLocked() {
	if d.closed {
		return
	}
	ends := d.ends.Load()
	id := d.conn.SessionID()
	has := d.conn.State() == zk.StateHasSession
	// A period that ended between the loads is seen by the next call.
	settled := has && id != 0 && d.ends.Load() == ends
	if g := d.cur; g != nil && (!settled || g.session != id || g.ends != ends) {
		d.endLocked()
	}
	if id == 0 {
		// go-zookeeper zeroes the id when the server reports the session
		// expired: its nodes are gone and it never comes back.
		clear(d.orphans)
		clear(d.suspects)
	}
	if d.cur == nil && settled {
		d.startLocked(id, ends)
	}
}

// startLocked starts the generation of a connected period of session id.
// Nodes left to delete when that session was back are deleted now; those of
// any other session are forgotten (it expired: the server deleted them).
func (d *Driver) startLocked(id int64, ends uint64) {
	d.cur = &generation{session: id, ends: ends, lost: make(chan struct{}), nodes: map[string]struct{}{}}
	var stale []string
	for p, s := range d.orphans {
		if s == id {
			stale = append(stale, p)
		} else {
			delete(d.orphans, p)
		}
	}
	if len(stale) > 0 {
		d.wg.Add(1)
		go d.deleteOrphans(stale)
	}
	for sp, s := range d.suspects {
		delete(d.suspects, sp)
		if s == id {
			d.wg.Add(1)
			go d.deleteByOwner(sp[0], sp[1], s)
		}
	}
	d.readyOnce.Do(func() { close(d.ready) })
}

// curLocked returns the current generation, reconciled with the
// connection, or nil.
func (d *Driver) curLocked() *generation {
	d.reconcileLocked()
	return d.cur
}

// endLocked ends the current generation: its grants are lost, and its nodes
// become orphans, deleted when the same session is back.
func (d *Driver) endLocked() {
	g := d.cur
	if g == nil {
		return
	}
	d.cur = nil
	close(g.lost)
	for p := range g.nodes {
		d.orphans[p] = g.session
	}
}

func (d *Driver) deleteOrphans(paths []string) {
	defer d.wg.Done()
	for _, p := range paths {
		ctx, cancel := context.WithTimeout(d.closeCtx, d.opTimeout)
		_, err := do(ctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(p, -1) }, nil)
		cancel()
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			d.mu.Lock()
			delete(d.orphans, p)
			d.mu.Unlock()
		}
	}
}

// Close ends pending calls and closes the session (the server deletes its
// nodes at once). Closing twice returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, x := range d.expiries {
		x.timer.Stop()
	}
	d.mu.Unlock()
	d.closeCancel()
	d.conn.Close()
	d.wg.Wait()
	return nil
}

// do runs fn, a go-zookeeper call, and returns its result, or ctx's error
// as soon as ctx ends. When the caller has gone and fn succeeded, undo (if
// not nil) runs with fn's result, so that a node created too late is
// deleted.
func do[T any](ctx context.Context, d *Driver, fn func() (T, error), undo func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	if !d.track() {
		var zero T
		return zero, driver.ErrClosed
	}
	go func() {
		defer d.wg.Done()
		v, err := fn()
		mu.Lock()
		gone := abandoned
		mu.Unlock()
		if gone {
			if err == nil && undo != nil {
				undo(v)
			}
			return
		}
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		mu.Lock()
		abandoned = true
		mu.Unlock()
		select {
		case r := <-ch: // it finished meanwhile
			if r.err == nil && undo != nil {
				undo(r.v)
			}
		default:
		}
		var zero T
		return zero, ctx.Err()
	}
}

// escapeKey percent-escapes every byte outside printable ASCII and "%",
// "/" and ".", so an escaped key is a valid ZooKeeper path element (never
// "." or "..", no "/", no character ZooKeeper rejects), escaping is
// injective and a prefix of a key escapes to a prefix of its escape.
func escapeKey(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c <= 0x20 || c >= 0x7f || c == '%' || c == '/' || c == '.' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func unescapeKey(s string) (string, error) { return url.PathUnescape(s) }

func (d *Driver) dir(key string) string { return d.locks() + "/" + escapeKey(key) }

// value is what a node stores.
type value struct {
	Holder string        `json:"holder,omitempty"`
	TTL    time.Duration `json:"ttl"`
	Mode   string        `json:"mode,omitempty"` // "" plain or writer, "shared" reader
}

// seqOf returns the sequence number of a child name "<owner>-<seq>".
func seqOf(name string) int64 {
	i := strings.LastIndexByte(name, '-')
	n, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func ownerOf(name string) string {
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		return name[:i]
	}
	return name
}

// sortChildren sorts children by sequence number.
func sortChildren(children []string) {
	sort.Slice(children, func(i, j int) bool { return seqOf(children[i]) < seqOf(children[j]) })
}

func grantKey(key, owner string) string { return key + "\x00" + owner }

// storeErr wraps an error of op. The root package adds the key and the
// store's URL, so they are not repeated here.
func storeErr(op string, err error) error {
	switch {
	case errors.Is(err, driver.ErrInvalidArgument), errors.Is(err, driver.ErrLeaseLost), errors.Is(err, driver.ErrNotAcquired),
		errors.Is(err, driver.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, driver.ErrUnavailable):
		return fmt.Errorf("zkdriver: %s: %w", op, err)
	case errors.Is(err, zk.ErrNoAuth), errors.Is(err, zk.ErrAuthFailed):
		// No permission or failed authentication: ErrPermissionDenied
		// (it matches ErrInvalidArgument too), never an outage.
		return fmt.Errorf("zkdriver: %s: %w: ZooKeeper refused the credentials: %w", op, driver.ErrPermissionDenied, err)
	case refused(err):
		return urlparam.Wrap("zkdriver: "+op+": ZooKeeper refused the request", err)
	}
	return fmt.Errorf("zkdriver: %s: %w: %w", op, driver.ErrUnavailable, err)
}

// refused reports whether err is an answer in which ZooKeeper refused the
// request itself (bad arguments, an invalid ACL or flags, no or failed
// authentication), which retrying cannot help.
func refused(err error) bool {
	for _, r := range []error{zk.ErrBadArguments, zk.ErrInvalidACL, zk.ErrInvalidFlags, zk.ErrNoAuth, zk.ErrAuthFailed, zk.ErrInvalidPath} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

var errNoSession = fmt.Errorf("%w: no ZooKeeper session (disconnected)", driver.ErrUnavailable)

// current returns the current generation, or nil.
func (d *Driver) current() (*generation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, driver.ErrClosed
	}
	if g := d.curLocked(); g != nil {
		return g, nil
	}
	return nil, errNoSession
}

// enqueued is a node created by enqueue.
type enqueued struct {
	path     string
	name     string
	gen      *generation
	stat     *zk.Stat // read right after the create (Czxid 0 when not read: see onlyChildFence)
	fence    int64    // the grant's fence, if granted
	children []string // sorted, as listed right after the create
}

// enqueue creates req's ephemeral sequential node and lists the key's
// children. On an error it has deleted the node, or left it to be deleted
// (orphan).
func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest) (enqueued, error) {
	return d.enqueueAs(ctx, req, "")
}

// enqueueAs is enqueue with the node's mode: "" for a plain lock (or a
// writer), sharedMode for a reader (see shared.go).
func (d *Driver) enqueueAs(ctx context.Context, req driver.AcquireRequest, mode string) (enqueued, error) {
	gen, err := d.current()
	if err != nil {
		return enqueued{}, err
	}
	dir := d.dir(req.Key)
	data, _ := json.Marshal(value{Holder: req.Holder, TTL: req.TTL, Mode: mode})
	var c created
	for attempt := 0; ; attempt++ {
		c, err = do(ctx, d, func() (created, error) { return d.createNode(dir, req.Owner, data) },
			func(c created) { d.deleteNode(c.path) })
		if errors.Is(err, zk.ErrNoNode) && attempt < 3 {
			// The key's container node is missing (never made, or
			// deleted by the server when it became empty).
			_, err = do(ctx, d, func() (string, error) {
				return d.conn.CreateContainer(dir, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll))
			}, nil)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return enqueued{}, err
			}
			continue
		}
		break
	}
	if err != nil {
		// The create may have happened with its reply lost: the node
		// (named by the owner token) is deleted when the session is back.
		d.orphanByOwner(gen, dir, req.Owner)
		return enqueued{}, err
	}
	path := c.path
	e := enqueued{path: path, name: path[len(dir)+1:], gen: gen}
	d.mu.Lock()
	if d.curLocked() != gen {
		d.orphans[path] = gen.session
		d.mu.Unlock()
		return enqueued{}, fmt.Errorf("%w: session ended while creating the node", driver.ErrUnavailable)
	}
	gen.nodes[path] = struct{}{}
	d.mu.Unlock()
	// When the node is the key's only child (the parent's stat from the
	// create's own transaction says so), its fence is that transaction's
	// zxid and no listing is needed. Otherwise list the queue; when the
	// node is the only child by then, the listing's parent stat gives its
	// fence (see onlyChildFence), else its stat is read (czxid: the fence;
	// one more round trip).
	var fence int64
	only := false
	if c.parent != nil && c.parent.NumChildren == 1 {
		e.children, fence, only = []string{e.name}, c.parent.Pzxid, true
	} else {
		var parent *zk.Stat
		if e.children, parent, err = d.childrenStat(ctx, dir); err == nil {
			fence, only = onlyChildFence(e.name, e.children, parent)
		}
	}
	if err == nil {
		if only && d.conn.SessionID() == gen.session {
			// A node this session created just now: version 0, owned
			// by the session; its czxid is not read (czxid 0 below).
			e.stat, e.fence = &zk.Stat{EphemeralOwner: gen.session}, fence
		} else if e.stat, err = d.exists(ctx, path); err == nil && e.stat != nil {
			e.fence = e.stat.Czxid
		}
	}
	if err == nil && (e.stat == nil || e.stat.EphemeralOwner != gen.session) {
		err = fmt.Errorf("%w: node %s is gone or not of this session", driver.ErrLeaseLost, path)
	}
	if err != nil {
		d.dropNode(ctx, e)
		return enqueued{}, err
	}
	return e, nil
}

// created is a node createNode made, with the stat of its parent read in
// the same transaction.
type created struct {
	path   string
	parent *zk.Stat
}

// createNode creates owner's ephemeral sequential node under dir, and in
// the same transaction (a multi) sets dir's data to empty, whose answer
// carries dir's stat as the create left it: when dir has one child, the node
// is the key's only node and so first in its queue, and dir's pzxid is the
// transaction's zxid, the node's czxid (its fence). That saves the queue
// listing, a round trip, on every acquisition of a free key: ZooKeeper's
// create answers with the path only. Nothing reads the data of a key's
// node (it stays empty; its version grows, and wraps harmlessly: the set
// names no version). The set fires no watch this driver waits on (it
// waits on children, and on a node's creation or deletion); a data watch
// left on the key's node by WatchKey's exists check is fired and cleared,
// unread. It needs the WRITE permission on the key's node, which the nodes
// this driver creates give everyone (world:cdrwa); a key node pre-created
// or re-ACLed without it refuses every acquisition (ErrPermissionDenied).
func (d *Driver) createNode(dir, owner string, data []byte) (created, error) {
	res, err := d.conn.Multi(
		&zk.CreateRequest{Path: dir + "/" + owner + "-", Data: data, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeralSequential},
		&zk.SetDataRequest{Path: dir, Data: nil, Version: -1},
	)
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("%w: ZooKeeper answered a multi of 2 operations with %d results", driver.ErrUnavailable, len(res))
	}
	if err != nil {
		// The first failed operation's error: zk.ErrNoNode when the key's
		// container node is missing.
		return created{}, err
	}
	return created{path: res[0].String, parent: res[1].Stat}, nil
}

// orphanByOwner deletes any node of owner under dir (an ambiguous create:
// the node may exist with its reply lost). When the key cannot be listed
// now, it is retried when gen's session is back.
func (d *Driver) orphanByOwner(gen *generation, dir, owner string) {
	if d.track() {
		go d.deleteByOwner(dir, owner, gen.session)
	}
}

// track adds a goroutine to the ones Close waits for, unless the driver is
// closed.
func (d *Driver) track() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.wg.Add(1)
	return true
}

func (d *Driver) deleteByOwner(dir, owner string, session int64) {
	defer d.wg.Done()
	ctx, cancel := context.WithTimeout(d.closeCtx, d.opTimeout)
	defer cancel()
	children, err := d.children(ctx, dir)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		d.mu.Lock()
		if !d.closed {
			d.suspects[[2]string{dir, owner}] = session
		}
		d.mu.Unlock()
		return
	}
	for _, c := range children {
		if ownerOf(c) == owner {
			d.deleteNode(dir + "/" + c)
		}
	}
}

// deleteNode deletes a node of ours whose create was abandoned.
func (d *Driver) deleteNode(p string) {
	if err := d.conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		d.mu.Lock()
		if g := d.curLocked(); g != nil {
			d.orphans[p] = g.session
		}
		d.mu.Unlock()
	}
}

// dropNode deletes e's node with a fresh bounded context; when that fails
// it stays an orphan of its generation.
func (d *Driver) dropNode(ctx context.Context, e enqueued) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	_, err := do(dctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(e.path, -1) }, nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil || errors.Is(err, zk.ErrNoNode) {
		delete(e.gen.nodes, e.path)
		delete(d.orphans, e.path)
		return
	}
	if d.curLocked() != e.gen {
		d.orphans[e.path] = e.gen.session
	}
}

func (d *Driver) children(ctx context.Context, dir string) ([]string, error) {
	children, _, err := d.childrenStat(ctx, dir)
	return children, err
}

// childrenStat lists dir's children, sorted, with dir's own stat.
func (d *Driver) childrenStat(ctx context.Context, dir string) ([]string, *zk.Stat, error) {
	type listing struct {
		children []string
		stat     *zk.Stat
	}
	l, err := do(ctx, d, func() (listing, error) {
		c, st, err := d.conn.Children(dir)
		return listing{c, st}, err
	}, nil)
	if err != nil {
		return nil, nil, err
	}
	sortChildren(l.children)
	return l.children, l.stat, nil
}

// onlyChildFence returns the fence of the node name that this session has
// just created, from the listing of its parent read in a later request of
// the same session, when the node is the parent's only child: the parent's
// pzxid, the zxid of the last create or delete of one of its children. That
// is the node's czxid unless another client created and deleted a node of
// the key in between, and in every case a valid fence: greater than every
// earlier holder's (their nodes were created, and their fences read, before
// the last change the listing saw) and smaller than every later holder's
// (their nodes are created after that change, and their fences are at
// least their czxid). Otherwise it returns false, and the node's stat is
// read (ZooKeeper's create answers with the path only).
func onlyChildFence(name string, children []string, parent *zk.Stat) (int64, bool) {
	if parent == nil || len(children) != 1 || children[0] != name || parent.Pzxid <= 0 {
		return 0, false
	}
	return parent.Pzxid, true
}

// granted records the grant of e's node, which has the lowest sequence
// number of its key.
func (d *Driver) granted(ctx context.Context, req driver.AcquireRequest, e enqueued) (driver.Grant, error) {
	d.mu.Lock()
	if d.curLocked() != e.gen {
		d.mu.Unlock()
		d.dropNode(ctx, e)
		return driver.Grant{}, fmt.Errorf("%w: session ended while granting", driver.ErrUnavailable)
	}
	gk := grantKey(req.Key, req.Owner)
	d.grants[gk] = grantInfo{path: e.path, czxid: e.stat.Czxid, version: e.stat.Version, gen: e.gen}
	x := &expiry{until: time.Now().Add(req.TTL), path: e.path, version: e.stat.Version}
	x.timer = time.AfterFunc(req.TTL, func() { d.expire(gk, x) })
	d.expiries[gk] = x
	d.mu.Unlock()
	return driver.Grant{Fence: uint64(e.fence), Lost: e.gen.lost}, nil
}

// expire runs when a grant's TTL has passed since its last confirmed
// renewal: the root package has declared the lease lost by then (its
// deadline is at most that, minus drift), so the node is deleted and the
// key freed, as a store-side TTL would.
func (d *Driver) expire(gk string, x *expiry) {
	d.mu.Lock()
	if d.expiries[gk] != x {
		d.mu.Unlock()
		return
	}
	if left := time.Until(x.until); left > 0 {
		x.timer.Reset(left) // a renewal moved it
		d.mu.Unlock()
		return
	}
	delete(d.expiries, gk)
	delete(d.grants, gk)
	d.mu.Unlock()
	if !d.track() {
		return
	}
	defer d.wg.Done()
	ctx, cancel := context.WithTimeout(d.closeCtx, d.opTimeout)
	defer cancel()
	_, _ = do(ctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(x.path, x.version) }, nil)
}

// exists returns the node's stat, or nil when it does not exist.
func (d *Driver) exists(ctx context.Context, p string) (*zk.Stat, error) {
	return do(ctx, d, func() (*zk.Stat, error) {
		ok, stat, err := d.conn.Exists(p)
		if err != nil || !ok {
			return nil, err
		}
		return stat, nil
	}, nil)
}

// TryAcquire creates req's node and keeps it only when it has the lowest
// sequence number of the key; otherwise it deletes it and returns
// driver.ErrNotAcquired.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	e, err := d.enqueue(ctx, req)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	if len(e.children) == 0 || e.children[0] != e.name {
		d.dropNode(ctx, e)
		return driver.Grant{}, storeErr("acquire", driver.ErrNotAcquired)
	}
	g, err := d.granted(ctx, req, e)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	return g, nil
}

// Wait creates req's node and waits, watching only the node just before
// it, until it has the lowest sequence number of the key. It stops with an
// error when the session (or the connection) is lost. When ctx ends it
// deletes its node (with a fresh bounded context) and returns an error
// matching ctx.Err().
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("wait", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(driver.ErrClosed) })
	defer stop()
	octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
	e, err := d.enqueue(octx, req)
	ocancel()
	if err != nil {
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	dir := d.dir(req.Key)
	for {
		idx := -1
		for i, c := range e.children {
			if c == e.name {
				idx = i
				break
			}
		}
		if idx < 0 {
			d.dropNode(ctx, e)
			return driver.Grant{}, d.waitErr(ctx, req.Key, fmt.Errorf("%w: own node %s is gone", driver.ErrLeaseLost, e.path))
		}
		if idx == 0 {
			g, err := d.granted(ctx, req, e)
			if err != nil {
				return driver.Grant{}, d.waitErr(ctx, req.Key, err)
			}
			return g, nil
		}
		pred := dir + "/" + e.children[idx-1]
		octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
		watch, err := do(octx, d, func() (<-chan zk.Event, error) {
			ok, _, ch, err := d.conn.ExistsW(pred)
			if err == nil && !ok {
				return nil, nil
			}
			return ch, err
		}, nil)
		ocancel()
		if err != nil {
			d.dropNode(ctx, e)
			return driver.Grant{}, d.waitErr(ctx, req.Key, err)
		}
		if watch != nil {
			select {
			case ev := <-watch:
				if ev.Type == zk.EventNodeDeleted && idx == 1 {
					// The holder, the only node ahead, is gone; no node
					// can be created ahead of this one.
					g, err := d.granted(ctx, req, e)
					if err != nil {
						return driver.Grant{}, d.waitErr(ctx, req.Key, err)
					}
					return g, nil
				}
			case <-e.gen.lost:
				d.dropNode(ctx, e)
				return driver.Grant{}, d.waitErr(ctx, req.Key, fmt.Errorf("%w: ZooKeeper session lost while waiting", driver.ErrUnavailable))
			case <-ctx.Done():
				d.dropNode(ctx, e)
				return driver.Grant{}, d.waitErr(ctx, req.Key, ctx.Err())
			}
		}
		octx, ocancel = context.WithTimeout(ctx, d.opTimeout)
		e.children, err = d.children(octx, dir)
		ocancel()
		if err != nil {
			d.dropNode(ctx, e)
			return driver.Grant{}, d.waitErr(ctx, req.Key, err)
		}
	}
}

func (d *Driver) waitErr(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, driver.ErrClosed) {
			return storeErr("wait", driver.ErrClosed)
		}
		return fmt.Errorf("zkdriver: wait %q: %w", key, ctx.Err())
	}
	return storeErr("wait", err)
}

// find returns owner's node on key: from the driver's grants, else by
// listing the key's children (the node name starts with the owner token).
// It returns "" when there is none.
func (d *Driver) find(ctx context.Context, key, owner string) (string, grantInfo, bool, error) {
	d.mu.Lock()
	gi, ok := d.grants[grantKey(key, owner)]
	d.mu.Unlock()
	if ok {
		return gi.path, gi, true, nil
	}
	dir := d.dir(key)
	children, err := d.children(ctx, dir)
	if errors.Is(err, zk.ErrNoNode) {
		return "", grantInfo{}, false, nil
	}
	if err != nil {
		return "", grantInfo{}, false, err
	}
	for _, c := range children {
		if ownerOf(c) == owner {
			return dir + "/" + c, grantInfo{}, false, nil
		}
	}
	return "", grantInfo{}, false, nil
}

// owned checks that node p exists, belongs to the current session and (when
// known) has the grant's czxid. It returns its stat or an error matching
// driver.ErrLeaseLost.
func (d *Driver) owned(ctx context.Context, p string, gi grantInfo, known bool) (*zk.Stat, error) {
	if p == "" {
		return nil, fmt.Errorf("%w: no node for this owner", driver.ErrLeaseLost)
	}
	gen, err := d.current()
	if err != nil {
		return nil, err
	}
	if known && gi.gen != gen {
		return nil, fmt.Errorf("%w: the connection or session of the grant ended", driver.ErrLeaseLost)
	}
	stat, err := d.exists(ctx, p)
	if err != nil {
		return nil, err
	}
	if stat == nil {
		return nil, fmt.Errorf("%w: node %s is gone", driver.ErrLeaseLost, p)
	}
	if stat.EphemeralOwner != gen.session || d.conn.SessionID() != gen.session {
		return nil, fmt.Errorf("%w: node %s belongs to session %x, not the current %x", driver.ErrLeaseLost, p, stat.EphemeralOwner, gen.session)
	}
	if known && gi.czxid != 0 && stat.Czxid != gi.czxid {
		return nil, fmt.Errorf("%w: node %s was replaced", driver.ErrLeaseLost, p)
	}
	return stat, nil
}

// Renew checks that owner's node still exists and belongs to the current
// session; the session, not ttl, keeps it alive. It returns
// driver.ErrLeaseLost otherwise.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return storeErr("renew", err)
	}
	if _, err := d.current(); errors.Is(err, driver.ErrClosed) {
		return storeErr("renew", err)
	}
	sent := time.Now()
	p, gi, known, err := d.find(ctx, key, owner)
	if err != nil {
		return storeErr("renew", err)
	}
	if _, err := d.owned(ctx, p, gi, known); err != nil {
		if errors.Is(err, driver.ErrLeaseLost) {
			d.forget(key, owner)
		}
		return storeErr("renew", err)
	}
	if known {
		gk := grantKey(key, owner)
		d.mu.Lock()
		x := d.expiries[gk]
		if x == nil {
			d.mu.Unlock()
			return storeErr("renew", fmt.Errorf("%w: not renewed within its TTL", driver.ErrLeaseLost))
		}
		x.until = sent.Add(ttl)
		d.mu.Unlock()
	}
	return nil
}

func (d *Driver) forget(key, owner string) {
	gk := grantKey(key, owner)
	d.mu.Lock()
	delete(d.grants, gk)
	if x := d.expiries[gk]; x != nil {
		x.timer.Stop()
		delete(d.expiries, gk)
	}
	d.mu.Unlock()
}

// Release deletes owner's node with the version it was read at, only when
// it belongs to the current session. It returns driver.ErrLeaseLost when
// there is no such node.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return storeErr("release", err)
	}
	if _, err := d.current(); errors.Is(err, driver.ErrClosed) {
		return storeErr("release", err)
	}
	p, gi, known, err := d.find(ctx, key, owner)
	if err != nil {
		return storeErr("release", err)
	}
	var version int32
	if gen, _ := d.current(); known && gen != nil && gi.gen == gen {
		// A grant of this connected period of this session: the node at
		// p (its name holds the owner token and a sequence number never
		// reused) can only be ours; delete it with the version it was
		// created with.
		version = gi.version
	} else {
		stat, err := d.owned(ctx, p, gi, known)
		if err != nil {
			if errors.Is(err, driver.ErrLeaseLost) {
				d.forget(key, owner)
			}
			return storeErr("release", err)
		}
		version = stat.Version
	}
	_, err = do(ctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(p, version) }, nil)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		err = fmt.Errorf("%w: %w", driver.ErrLeaseLost, err)
	}
	if err == nil || errors.Is(err, driver.ErrLeaseLost) {
		d.forget(key, owner)
		d.mu.Lock()
		if g := d.curLocked(); g != nil {
			delete(g.nodes, p)
		}
		d.mu.Unlock()
	}
	if err != nil {
		return storeErr("release", err)
	}
	return nil
}

// Inspect returns the holder of key (its lowest node) and the number of
// waiters, or driver.ErrNotAcquired when the key is free. Remaining is zero:
// ZooKeeper does not expose when a session would expire.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	dir := d.dir(key)
	for range 3 {
		children, err := d.children(ctx, dir)
		if errors.Is(err, zk.ErrNoNode) || (err == nil && len(children) == 0) {
			return driver.HolderInfo{}, storeErr("inspect", driver.ErrNotAcquired)
		}
		if err != nil {
			return driver.HolderInfo{}, storeErr("inspect", err)
		}
		type got struct {
			data []byte
			stat *zk.Stat
		}
		r, err := do(ctx, d, func() (got, error) {
			data, stat, err := d.conn.Get(dir + "/" + children[0])
			return got{data, stat}, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released meanwhile: list again
		}
		if err != nil {
			return driver.HolderInfo{}, storeErr("inspect", err)
		}
		var v value
		_ = json.Unmarshal(r.data, &v)
		return driver.HolderInfo{Key: key, Fence: uint64(r.stat.Czxid), Holder: v.Holder, TTL: v.TTL, Waiters: len(children) - 1}, nil
	}
	return driver.HolderInfo{}, storeErr("inspect", fmt.Errorf("%w: the holder kept changing", driver.ErrUnavailable))
}

// List returns the held keys starting with prefix, sorted by key.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	dirs, err := do(ctx, d, func() ([]string, error) {
		c, _, err := d.conn.Children(d.locks())
		return c, err
	}, nil)
	if err != nil {
		return nil, storeErr("list", err)
	}
	esc := escapeKey(prefix)
	var out []driver.HolderInfo
	for _, name := range dirs {
		if !strings.HasPrefix(name, esc) {
			continue
		}
		key, err := unescapeKey(name)
		if err != nil {
			continue
		}
		info, err := d.Inspect(ctx, key)
		if errors.Is(err, driver.ErrNotAcquired) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// SessionID returns the id of the current ZooKeeper session, or 0 while the
// driver has no session (disconnected).
func (d *Driver) SessionID() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g := d.curLocked(); g != nil {
		return g.session
	}
	return 0
}
