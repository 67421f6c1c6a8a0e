// Package dlockddriver is the dlock driver for dlockd, the dlock lock server
// (package server, command cmd/dlockd). Import it for its side effect to
// open "dlockd://host:port" URLs with dlock.Open:
//
//	import _ "github.com/dlock-dev/dlock/drivers/dlockddriver"
//
// # URL
//
// dlockd://host:port[,host:port…]?lock_delay=DURATION: the API addresses
// of one dlockd or of the members of a dlockd cluster (any subset: the
// Driver learns the others from the servers' leader hints). Every member
// needs both its host and its port (dlockd's usual port is DefaultPort,
// 7450): an empty host, port or list entry is a configuration error at
// Open, never a default, so that dlockd://$LOCKHOST:7450 with LOCKHOST
// unset cannot make every machine lock against a dlockd of its own; a
// member named twice is an error too. lock_delay (a Go duration such as
// 2s; see Options.LockDelay) is sent with every acquisition; absent or 0
// means the server's default. Any other parameter, or a lock_delay that is
// negative or not a duration, is a configuration error at Open.
// private_conn=1 (or true) gives the Driver connections of its own
// (Options.PrivateConn); by default the Drivers of one process opened on
// the same member with the same credentials share one connection.
//
// # Shared connections
//
// Drivers of one process share their gRPC connections, up to
// DriversPerConn Drivers per connection: same member address, same bearer
// token, same TLS configuration (Open's from the same URL parameters and
// unchanged files; Dial's Options.TLS by identity), no
// Options.DialOptions. Each Driver keeps its own session, streams and
// leader belief; sharing the socket lets grpc-go's writer put the
// messages of many Drivers in one write(2) under load, on the client and
// in the server's answers, with no wait added when idle (it flushes as soon
// as nothing more is queued). A Driver's Close ends its own calls at once
// and closes a connection when it was the last Driver on it.
//
// A Wait holds a stream of its connection until it ends, and dlockd allows
// 1,024 streams per connection by default: past WaitsPerConn (512) Waits
// on one connection, the next go on another connection to the same member,
// dialled for Waits, so that a process with thousands of waiting Acquires
// still queues every one of them at the server and its other calls still
// find a stream.
//
// # TLS
//
// A dlockd started with --tls-cert and --tls-key serves gRPC over TLS
// only; its URL says so:
//
//	dlockd://host:port[,host:port…]?tls=1&ca=FILE&cert=FILE&key=FILE&server_name=NAME
//
// The parameters:
//
//   - tls=1 (or true) dials every member over TLS and verifies its
//     certificate for the member's host, against the system roots or,
//     with ca=FILE, against the CA certificate(s) in FILE (PEM). tls=0 (or
//     false, the default) dials in clear.
//   - cert=FILE and key=FILE present a client certificate (PEM), which a
//     dlockd started with --tls-client-ca requires. Both or neither.
//   - server_name=NAME verifies every member's certificate for NAME
//     instead of its host.
//
// ca, cert and key imply tls=1; server_name needs it. Every member of the
// URL, and every member learned from leader hints, is dialled with the
// same TLS. The files are read by Open: a missing file, one that does not
// parse, or a key that does not match its certificate is an error
// matching driver.ErrInvalidArgument naming the parameter and the file.
// TLSConfig turns a URL into its tls.Config (the dlock CLI uses it for its
// HTTP calls too). A plaintext Driver refused by a TLS port gets a
// connection error (driver.ErrUnavailable at the root) that hints at
// tls=1; a TLS Driver dialling a plaintext port gets
// driver.ErrInvalidArgument saying the port does not serve TLS. A server
// certificate that does not verify is a connection error saying why (the
// name checked and the certificate's names, an untrusted issuer); a client
// certificate the server refuses (none where --tls-client-ca asks one,
// another CA's, expired) is driver.ErrPermissionDenied naming the cause.
//
// # Tokens
//
// A dlockd started with --auth-file needs a bearer token:
// token_file=FILE names a file holding it (read once by Open; its trailing
// newline trimmed). Every call and stream sends it as
// "authorization: Bearer TOKEN". Without tls=1 the token is sent only to
// loopback addresses. ContextWithToken passes a token held in memory
// instead (the dlock CLI's --token and DLOCK_TOKEN). Calls dlockd refuses
// for the token or its permission return driver.ErrPermissionDenied. See
// token.go.
//
// # Capabilities
//
//   - driver.Driver: TryAcquire, Renew (one item of the server's batched
//     renewal), Release.
//   - driver.Waiter: Wait queues on the server's FIFO queue for the key and is
//     told of the grant by the server in the same Raft entry that released
//     the previous holder: no polling. A grant handed over this way must be
//     claimed within the server's claim window; Wait claims it (a renewal)
//     before it returns, and queues again if the window passed.
//   - driver.UnconfirmedWaiter: WaitUnconfirmed returns a handed-over grant
//     unclaimed, with the window in Grant.ConfirmWithin, and the caller's
//     first renewal claims it (the root package's leases do, a few
//     milliseconds after the grant), so the claim's round trip is not on a
//     contended key's handoff. For both, when the caller's context ends, the
//     wait cancels on the same stream and returns only after the server has
//     removed the queue entry (or released a grant that raced the
//     cancellation), bounded by Options.CleanupTimeout; a wait that moved
//     between members, or whose stream's node may not lead, is also
//     cancelled with CancelWait on the leader.
//   - driver.Inspector: Inspect and List, linearizable reads on the leader;
//     List follows the server's pages until the last.
//   - driver.ForceReleaser: ForceRelease removes a grant whoever holds it,
//     with a reason the server logs (dlock release --force).
//   - driver.Resumer: Resume re-attaches a restarted process to a grant it
//     still holds (dlock's Locker.Resume), same fence, its loss then pushed
//     to this Driver's session (resume.go).
//   - driver.SharedLocker: SharedView gives native counted permits
//     (semaphores) and read-write locks, kept in the server's state machine
//     with FIFO waits and writer preference; an Exclusive view's grants are
//     plain locks of the same key (shared.go).
//   - driver.KeyWatcher: WatchKey is pushed by the server's Watch stream
//     on keys (CHANGED events), so election.Observe needs no polling
//     (watchkey.go).
//   - Loss push: each Driver keeps one Watch stream (its session) open; when
//     the server ends a grant made by this Driver without a release
//     (expired, force-released, or handed over and not claimed), Grant.Lost
//     closes at once, and the reason is kept for the error of a later Renew
//     or Release of that grant. A loss that reached no stream (applied
//     while the stream reconnected, or moved to a new leader: members
//     apply the log at different times) is found by a fence check of the
//     live grants after each stream opens; past that, by renewals and the
//     validity deadline.
//
// TryAcquire, Release and Renew travel on one Session stream per Driver,
// open on the leader and shared by all its calls (one message each way per
// call); while the stream is not open (at start, after a failure or a
// leader change, or with an older server), or when it fails a call (it
// broke, or its node answers NOT_LEADER), they use the unary RPCs, which
// follow the leader. Options.NoSession forces unary RPCs.
//
// # Clusters: following the leader
//
// The Driver keeps one gRPC connection per member (made on first use;
// shared with the process's other Drivers of that member and credentials,
// see "Shared connections" below) and a belief of which member leads,
// first the URL's first member. Every call goes to the believed leader:
//
//   - A node that is not the leader answers NOT_LEADER with a hint, the
//     leader's API address (an errdetails.ErrorInfo detail, Reason
//     NOT_LEADER, Metadata leader_api); the Driver moves its belief there
//     and sends the call again at once (an address not in the URL becomes a
//     member, at most 16 such). A follower may also forward a unary call to
//     the leader itself and return its answer: that is fine for the call,
//     and the Session loop still moves the Driver to the leader.
//   - A hint naming no one (an election is running) or the answering node
//     itself (a new leader still catching up): the next member, after a
//     short jittered pause (20 ms doubling to 400 ms, full jitter).
//   - A connection failure, or SHUTTING_DOWN: the next member at once
//     (after a whole round of members has failed, a pause). With more than
//     one member an attempt gets at most half the call's remaining time
//     (at least 250 ms), so that a frozen leader leaves time to ask another
//     member; a member that did not answer in time loses the belief.
//
// A call keeps trying until its context ends (a context without a deadline:
// for 10 s), then returns its last attempt's error. A Driver that knows one
// member only (a single dlockd, and no hint named another) makes one
// attempt per call as a plain gRPC call would (its streams wait for the
// connection): a single node that is down is reported at once, and the
// root package retries by its own rules. The Session loop finds
// the leader (an empty renewal sent with the dlock-forwarded mark, which a
// follower answers itself: only a leader that a quorum follows confirms
// it), opens the Session stream there, reopens it when the belief moves or
// the stream breaks, and probes its node every 2 s (every 250 ms while a
// Wait is queued). The Watch stream may be served by any member; it is
// opened on the believed leader, moved when the belief moves (the new
// stream is open before the old closes), and reopened after a break.
//
// # Retries and why they are safe
//
// A retried call may follow an attempt that took effect on the server but
// whose answer was lost (the connection broke, or a deposed leader
// answered NOT_LEADER after proposing). The driver retries only calls the
// server treats idempotently:
//
//   - Acquire (try): a repeat by the holder's owner token answers the same
//     grant (same fence), renewed to the requested TTL.
//   - Wait: the same owner token re-attaches to its queue entry (QUEUED
//     with its position), or is answered the grant if the key was handed
//     to it meanwhile; DUPLICATE_WAIT on a re-send (the node still runs the
//     previous stream's handler) is retried after a pause.
//   - Renew, CancelWait, Inspect, List, CheckFence: repeating changes
//     nothing more.
//   - Release: a repeat after a release that took effect answers
//     LEASE_LOST. Release reports that case as released (nil): see Release
//     for why, and for the one case it misreports.
//   - ForceRelease is not idempotent (a repeat could remove the grant the
//     key was handed to next) and is never retried, except when gRPC could
//     not connect at all (nothing was sent).
//
// # What a client sees during an election
//
// While no member leads (the old leader died or was cut off and the others
// have not yet elected one: about one Raft election timeout, 1 s by
// default, after the old leader's last heartbeat), every call of a Driver
// that knows several members is retried by the driver as above until its
// context ends:
//
//   - If a new leader is elected and reachable before then, the call
//     succeeds, late by the election; nothing else is visible.
//   - Otherwise the call returns a plain error (its last attempt's:
//     NOT_LEADER, or the connection's failure) when its context ends. The
//     root package's calls pass a context bounded by the op timeout
//     (dlock.WithOpTimeout, 5 s by default), so they return
//     dlock.ErrUnavailable after the op timeout.
//   - The root package then retries by its own rules: a waiting Acquire
//     retries store errors until its context ends (dlock.WithRetryFor, by
//     default no limit), so a waiting `dlock run` rides through elections
//     and restarts unless a retry budget is set; TryAcquire makes one attempt; the heartbeat retries a failed
//     renewal with jittered backoff until the lease's validity deadline, so
//     a lease survives a leader change when the new leader is elected and
//     reachable within its remaining validity (the new leader restarts the
//     countdown, see package server); a Release that fails leaves the grant
//     to expire by its TTL.
//   - A queued Wait is not failed by a leader change: it re-attaches to the
//     new leader with the same owner token within the server's grace (the
//     waiter's TTL) and keeps its place; only its context's end, a refusal
//     by the server, or contact lost for longer than max(TTL, op timeout)
//     end it (the last is dlock.ErrUnavailable at the root, which then
//     queues again, at the back).
//   - The Session and Watch streams reconnect by themselves; a loss pushed
//     while the Watch stream was down is found by the next renewal or the
//     validity deadline instead.
//
// Beyond the driver interfaces, Driver has RenewBatch (many grants in one
// request) and CheckFence (Chubby's sequencer check: is fence F the current
// grant of key K — a weaker check than a resource that stores fences).
//
// # Guarantees
//
// Fences are Raft log indexes: greater than every fence issued before on the
// server, surviving restarts (the log is fsynced). Expiry is decided by the
// server leader's monotonic clock, late rather than early (see package
// server). A grant lost without a release keeps its key from everyone for
// the lock-delay, so that a paused holder's in-flight writes land before
// the next holder starts (Chubby's lock-delay); fencing at the resource is
// still the real protection. Connection failures and NOT_LEADER answers are
// returned as plain errors (after the failover above); the root package
// reports them as dlock.ErrUnavailable.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the dlockd and dlockd3 sections of docs/GUARANTEES.md hold the
// figures, for one node (kill, restart-lossy, links, a jump of its lease
// clock) and a three-node cluster (partitions, leader isolation, kill and
// pause, a jump of the leader's clock). make verify regenerates them.
package dlockddriver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/notgrpc"
	"github.com/dlock-dev/dlock/internal/urlparam"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Scheme is the URL scheme of dlockd stores.
const Scheme = "dlockd"

// DefaultPort is dlockd's usual port (cmd/dlockd's default listen port).
// A dlockd URL must still name its port: Open does not default it.
const DefaultPort = "7450"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return Open(ctx, u)
	})
}

// Options configure a Driver. A nil *Options means all defaults.
type Options struct {
	// DialOptions are added to the gRPC dial options of every member's
	// connection, including members learned from leader hints (after the
	// defaults: insecure credentials, or TLS when TLS is set, and a
	// reconnect backoff capped at 1s).
	DialOptions []grpc.DialOption
	// CleanupTimeout bounds the cleanup Wait does after its context ended
	// (cancelling the queue entry, releasing a raced grant). Zero: 5s.
	CleanupTimeout time.Duration
	// NoWatch turns the loss-push stream off: Grant.Lost stays nil.
	NoWatch bool
	// NoSession makes every call a unary RPC instead of a message on the
	// Driver's Session stream (which costs less per call).
	NoSession bool
	// LockDelay is sent with every acquisition: after the grant is lost
	// without a release (expiry, force release, a handover not claimed in
	// time), the server grants the key to nobody for this long. It is capped
	// at each grant's TTL (the server's limit). Zero: the server's default
	// (dlockd --lock-delay). Negative: Dial fails (New treats it as zero).
	LockDelay time.Duration
	// ListPageSize is how many holders List asks for per request. Zero: the
	// server's default page. Negative or above 2^32-1: Dial fails (New
	// treats it as zero).
	ListPageSize int
	// TLS, when not nil, makes every member's connection TLS with (a copy
	// of) this configuration; an empty ServerName verifies each member
	// for its own host. Nil: plaintext. Open sets it from the URL's tls,
	// ca, cert, key and server_name (see TLSConfig).
	TLS *tls.Config
	// Token is a bearer token sent with every call (see token.go's
	// "Bearer tokens"): to a dlockd started with --auth-file. Empty: none.
	// Open sets it from the URL's token_file or ContextWithToken. Without
	// TLS, Dial refuses it for a member that is not on loopback.
	Token string
	// PrivateConn makes the Driver dial connections of its own instead of
	// sharing the process's connections with other Drivers of the same
	// members and credentials (connshare.go: "Shared connections"). False
	// (the default): shared, up to DriversPerConn Drivers per connection;
	// Drivers with DialOptions never share. Open sets it from the URL's
	// private_conn=1.
	PrivateConn bool

	// tlsID names TLS's configuration for sharing connections: set by
	// Open (tlsConfig), whose configurations from the same files are
	// equal; "" otherwise, and TLS is then compared by identity.
	tlsID string
}

// check reports a configuration error in o (matching
// driver.ErrInvalidArgument), never an outage.
func (o *Options) check() error {
	if o.LockDelay < 0 {
		return urlparam.Invalid("dlockd: lock delay %v is negative", o.LockDelay)
	}
	if o.ListPageSize < 0 || int64(o.ListPageSize) > math.MaxUint32 {
		return urlparam.Invalid("dlockd: list page size %d is outside [0, %d]", o.ListPageSize, uint32(math.MaxUint32))
	}
	return nil
}

// Driver is a dlockd client. It is safe for concurrent use. Two Drivers are
// two independent clients.
type Driver struct {
	cl        *cluster // the members, their connections, the believed leader
	session   string
	cleanup   time.Duration
	lockDelay time.Duration
	pageSize  uint32
	noWatch   bool

	mu      sync.Mutex
	closed  bool
	lost    map[grantKey]lostEntry // Lost channels of live grants
	reasons recent[string]         // the server's reasons of recent losses
	early   recent[uint64]         // fences of losses pushed before their grant was registered (see grant)
	// rechecking: a fence check of the live grants runs; recheckAgain: a
	// Watch stream opened during it, so one more follows (startRecheck).
	rechecking, recheckAgain bool

	watchCtx    context.Context
	watchCancel context.CancelFunc
	watchWG     sync.WaitGroup // the Watch and Session loops, background cleanups

	calls       atomic.Pointer[callStream] // the Session stream; nil: use unary RPCs
	noSession   bool                       // no Session loop (Options.NoSession)
	waiting     atomic.Int32               // Waits queued now (the Session loop probes the leader more often)
	waitStarted chan struct{}              // poked (never blocking) when a Wait starts
	sessionKick chan struct{}              // poked (never blocking) when a unary write succeeds with no Session stream (unaryWrote)
	handedOn    handedOnKeys               // keys this Driver's releases handed to a waiter (wait.go)
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Waiter        = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.ForceReleaser = (*Driver)(nil)
)

// urlParams are the query parameters Open understands.
var urlParams = append([]string{"lock_delay", "private_conn", "token_file"}, tlsParams...)

// Open opens a Driver for a dlockd://host:port[,host:port…][?lock_delay=DURATION]
// URL (see the package documentation). The connections are made lazily:
// Open does not fail when the servers are down. It returns an error
// matching driver.ErrInvalidArgument (never driver.ErrUnavailable) for
// another scheme, an empty host list or entry, a member without a host or a
// port, a port outside 1..65535, a member named twice, a user or path, an
// unknown query parameter, a lock_delay that is not a duration or is
// negative, or TLS parameters TLSConfig refuses (a file missing or not
// parsing, cert without key).
func Open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != Scheme {
		return nil, urlparam.Invalid("dlockd: URL scheme %q, want %q", u.Scheme, Scheme)
	}
	opts := &Options{}
	q := u.Query()
	var err error
	if err = urlparam.Known("dlockd", q, urlParams...); err != nil {
		return nil, err
	}
	if v := q.Get("lock_delay"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, urlparam.Invalid("dlockd: URL parameter lock_delay=%q is not a duration of 0 or more", v)
		}
		opts.LockDelay = d
	}
	if v := q.Get("private_conn"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, urlparam.Invalid("dlockd: URL parameter private_conn=%q is not 1, 0, true or false", v)
		}
		opts.PrivateConn = b
	}
	if opts.TLS, opts.tlsID, err = tlsConfig(u); err != nil { // tls, ca, cert, key, server_name
		return nil, err
	}
	if opts.Token, err = Token(ctx, u); err != nil { // token_file, or the context's (token.go)
		return nil, err
	}
	if _, err := parseMembers(u.Host, "dlockd://HOST:PORT[,HOST:PORT...]"); err != nil {
		return nil, err
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") {
		return nil, urlparam.Invalid("dlockd: URL %q: want dlockd://host:port[,host:port...][?lock_delay=DURATION&tls=1&ca=FILE&cert=FILE&key=FILE&server_name=NAME&token_file=FILE], without user or path", u.Redacted())
	}
	return Dial(u.Host, opts)
}

// parseMembers splits a comma-separated list of host:port API addresses
// and checks it strictly: at least one, none empty, each with a host and a
// port in 1..65535, none named twice (compared as written, after trimming
// spaces). shape is the form shown in errors. Every error matches
// driver.ErrInvalidArgument.
func parseMembers(list, shape string) ([]string, error) {
	if err := urlparam.Addrs("dlockd", list, shape, true); err != nil {
		return nil, err
	}
	addrs := urlparam.Hosts(list)
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if seen[a] {
			return nil, urlparam.Invalid("dlockd: member %q is named twice in %q (want %s)", a, list, shape)
		}
		seen[a] = true
	}
	return addrs, nil
}

// Dial opens a Driver on the dlockd cluster whose members' API addresses
// target lists (host:port, or several separated by commas), with one gRPC
// connection per member, made on first use and shared with other Drivers
// of the process unless opts.PrivateConn (connshare.go), which Close
// closes (a shared one when its last Driver closes). Calls go to
// the member believed to lead; see the package documentation for how the
// Driver follows the leader. It returns an error for invalid opts, and an
// error matching driver.ErrInvalidArgument for a target with an empty
// entry, a member without a host or a port, or a member named twice; it
// does not connect yet.
func Dial(target string, opts *Options) (*Driver, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	addrs, err := parseMembers(target, "HOST:PORT[,HOST:PORT...]")
	if err != nil {
		return nil, err
	}
	if err := checkTokenTransport(addrs, opts); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = explainingCreds{TransportCredentials: credentials.NewTLS(opts.TLS.Clone()), serverName: opts.TLS.ServerName}
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		// Find a dead server within about 40s even with no call running.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Static flow-control windows turn off BDP ping probing.
		grpc.WithInitialWindowSize(1 << 20),
		grpc.WithInitialConnWindowSize(1 << 20),
	}
	if opts.Token != "" { // on every RPC, streams included (token.go)
		dopts = append(dopts, grpc.WithPerRPCCredentials(bearer{token: opts.Token, requireTLS: opts.TLS != nil}))
	}
	dopts = append(dopts, opts.DialOptions...)
	// Check the options once, as grpc.NewClient would on first use.
	cc, err := grpc.NewClient("passthrough:///"+addrs[0], dopts...)
	if err != nil {
		return nil, urlparam.Wrap("dlockd: dial "+addrs[0], err)
	}
	_ = cc.Close()
	var share *connKey
	if !opts.PrivateConn && len(opts.DialOptions) == 0 {
		share = &connKey{token: opts.Token}
		switch {
		case opts.TLS == nil:
		case opts.tlsID != "":
			share.tlsID = opts.tlsID
		default:
			share.tls = opts.TLS
		}
	}
	return newDriver(newCluster(addrs, dopts, share), opts), nil
}

// New returns a Driver over a connection the caller owns and closes; Close
// does not close it. The Driver knows one member, the connection's: it
// does not follow leader hints to other addresses (it could not dial them
// as the caller does), so a NOT_LEADER answer is returned as a plain error.
func New(cc grpc.ClientConnInterface, opts *Options) *Driver {
	if opts == nil {
		opts = &Options{}
	}
	return newDriver(newFixedCluster(cc), opts)
}

func newDriver(cl *cluster, opts *Options) *Driver {
	d := &Driver{
		cl:          cl,
		session:     newSession(),
		cleanup:     opts.CleanupTimeout,
		lockDelay:   max(opts.LockDelay, 0),
		noWatch:     opts.NoWatch,
		noSession:   opts.NoSession,
		lost:        make(map[grantKey]lostEntry),
		waitStarted: make(chan struct{}, 1),
		sessionKick: make(chan struct{}, 1),
		reasons:     newRecent[string](),
		early:       newRecent[uint64](),
	}
	if opts.ListPageSize > 0 && int64(opts.ListPageSize) <= math.MaxUint32 {
		d.pageSize = uint32(opts.ListPageSize)
	}
	if d.cleanup <= 0 {
		d.cleanup = 5 * time.Second
	}
	d.watchCtx, d.watchCancel = context.WithCancel(context.Background())
	if !opts.NoWatch {
		d.watchWG.Add(1)
		go d.watchLoop()
	}
	if !opts.NoSession {
		d.watchWG.Add(1)
		go d.sessionLoop()
	}
	return d
}

// Members returns the API addresses of the members the Driver knows: the
// URL's, in its order, then those learned from leader hints. It is empty
// for a Driver made by New.
func (d *Driver) Members() []string {
	d.cl.mu.Lock()
	defer d.cl.mu.Unlock()
	var out []string
	for _, m := range d.cl.members {
		if m.addr != "" {
			out = append(out, m.addr)
		}
	}
	return out
}

// Leader returns the API address of the member the Driver believes leads
// ("" for a Driver made by New). The belief follows the servers' hints and
// the Driver's probes; it may be stale.
func (d *Driver) Leader() string {
	m, _ := d.cl.current()
	return m.addr
}

// Session returns the client session ID this Driver's grants are made
// under.
func (d *Driver) Session() string { return d.session }

// Close stops the Watch and Session streams and closes the connections Dial
// made. Grants are not released: the server expires them. Closing twice
// returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.watchCancel()
	d.watchWG.Wait()
	return d.cl.close()
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// TryAcquire implements driver.Driver. A retry (after a leader change or a
// lost answer) is safe: the server answers a repeat by the holder's owner
// token with the same grant, renewed.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.tryAcquire(ctx, req, grantKind{})
}

// tryAcquire is TryAcquire of a grant of kind k (shared.go).
func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest, k grantKind) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: acquire: %w", err)
	}
	areq := d.acquireReq(req, false, k)
	sresp, fallback, _, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Acquire{Acquire: areq}})
	if !fallback {
		if err != nil {
			return driver.Grant{}, mapErr(ctx, "acquire", req.Key, err)
		}
		return d.grant(req, sresp.GetAcquire().GetFence()), nil
	}
	var resp *dlockv1.AcquireResponse
	_, err = d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
		resp, err = c.Acquire(ctx, areq)
		return err
	})
	if err != nil {
		return driver.Grant{}, mapErr(ctx, "acquire", req.Key, err)
	}
	d.unaryWrote()
	return d.grant(req, resp.GetFence()), nil
}

// acquireReq is req as the server wants it, for a grant of kind k, with
// the Driver's session and lock-delay (capped at the TTL, the server's
// limit).
func (d *Driver) acquireReq(req driver.AcquireRequest, wait bool, k grantKind) *dlockv1.AcquireRequest {
	areq := &dlockv1.AcquireRequest{
		Key: req.Key, Owner: req.Owner, Ttl: durationpb.New(req.TTL), Holder: req.Holder,
		Wait: wait, Session: d.session, Shared: k.shared, Limit: k.limit,
	}
	if d.lockDelay > 0 {
		areq.LockDelay = durationpb.New(min(d.lockDelay, req.TTL))
	}
	return areq
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("dlockd: renew: %w", err)
	}
	errs, err := d.RenewBatch(ctx, []RenewItem{{Key: key, Owner: owner, TTL: ttl}})
	if err != nil {
		return err
	}
	return errs[0]
}

// RenewItem is one grant to renew.
type RenewItem struct {
	Key, Owner string
	// TTL is the new full TTL; zero keeps the grant's.
	TTL time.Duration
}

// RenewBatch renews many grants in one request. It returns one error per
// item (nil, or driver.ErrLeaseLost wrapped with the server's reason when
// known, or driver.ErrInvalidKey / driver.ErrInvalidTTL), or a request
// error (an invalid item may fail the whole request; connection failures
// are plain errors).
func (d *Driver) RenewBatch(ctx context.Context, items []RenewItem) ([]error, error) {
	if d.isClosed() {
		return nil, driver.ErrClosed
	}
	req := &dlockv1.RenewRequest{Items: make([]*dlockv1.RenewItem, len(items))}
	for i, it := range items {
		req.Items[i] = &dlockv1.RenewItem{Key: it.Key, Owner: it.Owner}
		if it.TTL != 0 {
			req.Items[i].Ttl = durationpb.New(it.TTL)
		}
	}
	var resp *dlockv1.RenewResponse
	sresp, fallback, _, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Renew{Renew: req}})
	if err == nil && !fallback {
		resp = sresp.GetRenew()
	} else if fallback {
		// Renewals are idempotent: a retry renews again.
		_, err = d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
			resp, err = c.Renew(ctx, req)
			return err
		})
		if err == nil {
			d.unaryWrote()
		}
	}
	if err != nil {
		key := ""
		if len(items) == 1 {
			key = items[0].Key
		}
		return nil, mapErr(ctx, "renew", key, err)
	}
	if len(resp.GetResults()) != len(items) {
		return nil, fmt.Errorf("dlockd: renew: %d results for %d items", len(resp.GetResults()), len(items))
	}
	errs := make([]error, len(items))
	for i, r := range resp.GetResults() {
		it := items[i]
		switch {
		case r.GetOk():
		case r.GetReason() == "INVALID_KEY":
			errs[i] = fmt.Errorf("dlockd: renew %q: %w", it.Key, driver.ErrInvalidKey)
		case r.GetReason() == "INVALID_TTL":
			errs[i] = fmt.Errorf("dlockd: renew %q: %w: %v", it.Key, driver.ErrInvalidTTL, it.TTL)
		case strings.HasPrefix(r.GetReason(), "INVALID_"):
			// INVALID_OWNER, INVALID_REQUEST: refused as invalid, not lost.
			errs[i] = fmt.Errorf("dlockd: renew %q: %w: the server refused it (%s)", it.Key, driver.ErrInvalidArgument, r.GetReason())
		default:
			errs[i] = fmt.Errorf("dlockd: renew %q: %w", it.Key, d.leaseLost(it.Key, it.Owner))
			d.forget(it.Key, it.Owner)
		}
	}
	return errs, nil
}

// leaseLost is driver.ErrLeaseLost for owner's grant on key, with the
// server's reason when the Watch stream told one.
func (d *Driver) leaseLost(key, owner string) error {
	if why := d.lossReason(key, owner); why != "" {
		return fmt.Errorf("%w (%s)", driver.ErrLeaseLost, why)
	}
	return driver.ErrLeaseLost
}

// Release implements driver.Driver.
//
// A release retried after an attempt whose outcome is unknown (its answer
// was lost with a connection or a leader change, or a stale leader answered
// NOT_LEADER after proposing it) may find the key no longer held by the
// owner token because that earlier attempt released it. Such an answer
// (LEASE_LOST after a retry) is reported as a success, unless the Watch
// stream told this Driver that the server ended the grant (expiry, force
// release), which is then reported as driver.ErrLeaseLost with the reason.
// The reasoning: a caller releases within its validity deadline, before
// which the server never expires the grant (the server's countdown starts
// after the client's and a new leader restarts it), and a force release is
// pushed on the Watch stream; so within validity, "not held" after an
// ambiguous attempt means that attempt took effect. The one miss is a force
// release whose push was lost while the Watch stream was reconnecting or
// moving, and not yet found by the fence check that follows, reported as
// released. A release answered LEASE_LOST at its first attempt is always
// driver.ErrLeaseLost.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if d.isClosed() {
		return driver.ErrClosed
	}
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("dlockd: release: %w", err)
	}
	rreq := &dlockv1.ReleaseRequest{Key: key, Owner: owner}
	sresp, fallback, sent, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Release{Release: rreq}})
	next := sresp.GetRelease().GetNextFence()
	retried := false
	if fallback {
		var res callResult
		res, err = d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) error {
			r, err := c.Release(ctx, rreq)
			next = r.GetNextFence()
			return err
		})
		retried = sent || res.retried
		if err == nil {
			d.unaryWrote()
		}
	}
	if err == nil && next != 0 {
		d.handedOn.note(key)
	}
	if err != nil {
		err = mapErr(ctx, "release", key, err)
		if errors.Is(err, driver.ErrLeaseLost) {
			why := d.lossReason(key, owner)
			d.forget(key, owner)
			if retried && why == "" {
				return nil // an earlier attempt released it: see above
			}
			return d.leaseLost(key, owner) // the root package adds the operation, key and store
		}
		return err
	}
	d.forget(key, owner)
	return nil
}

// mapErr turns a gRPC error into the driver's: the contract's sentinels for
// the server's answers, a plain error (ErrUnavailable at the root) for the
// rest, and ctx's error joined when ctx ended.
//
// The server's answers map as follows (its reason, after the code, where it
// matters):
//
//   - FailedPrecondition (LOCK_HELD): driver.ErrNotAcquired.
//   - NotFound (LEASE_LOST, NOT_HELD): driver.ErrLeaseLost.
//   - InvalidArgument: INVALID_KEY is driver.ErrInvalidKey, INVALID_TTL
//     driver.ErrInvalidTTL, an invalid holder driver.ErrInvalidHolder, any
//     other (INVALID_OWNER, INVALID_REQUEST) driver.ErrInvalidArgument.
//   - OutOfRange, AlreadyExists (DUPLICATE_WAIT: the owner token already
//     waits), ResourceExhausted with REQUEST_TOO_LARGE or a message over
//     gRPC's size limit: the request itself was refused, so
//     driver.ErrInvalidArgument; retrying cannot help.
//   - PermissionDenied (the token's identity lacks the permission on the
//     key) and Unauthenticated (no token, or one the server does not
//     know, or no client certificate where --tls-client-ca asks one):
//     driver.ErrPermissionDenied, never an outage. So is a client
//     certificate the server refuses in the TLS handshake (expired, of
//     another CA: the TLS alert it sends), the error naming the cause.
//   - A server certificate this Driver does not accept (not naming the
//     name checked, of an untrusted issuer, expired): a plain error
//     saying which name was checked and which names the certificate
//     carries, or why the issuer is not trusted.
//   - A peer that answers but does not speak dlockd's protocol (the URL
//     points at Redis, an HTTP/1.1 server, a plain server when TLS was
//     asked, ...): driver.ErrInvalidArgument, "the server does not speak
//     the dlockd protocol (is it dlockd?)" — a configuration error, so
//     WithFailOpen must not run work unlocked. grpc-go has no status code
//     for this (it reports codes.Unavailable with its transport's text), so
//     the class is recognised by message (drivers/internal/notgrpc).
//   - Everything else is a plain error, reported by the root package as
//     ErrUnavailable: Unavailable (connection failures, NOT_LEADER,
//     SHUTTING_DOWN: transient, the root retries them), DeadlineExceeded,
//     ResourceExhausted for the server's capacity (TOO_MANY_WAITERS,
//     TOO_MANY_LEASES, TOO_MANY_STREAMS, ...), Internal, Unknown.
//
// The root package adds the operation, key and store URL, so the error says
// only what the server answered, in its own words, without gRPC's
// "rpc error: code = ... desc =" wrapping.
func mapErr(ctx context.Context, op, key string, err error) error {
	if lu := (*leaderUnreachableError)(nil); errors.As(err, &lu) {
		// The cause is known and plain: not the context's end.
		return fmt.Errorf("dlockd %s: %w", op, lu)
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	msg := st.Message()
	reason := ""
	if i := strings.LastIndex(msg, " ("); i >= 0 && strings.HasSuffix(msg, ")") {
		reason = msg[i+2 : len(msg)-1]
	}
	var sentinel error
	switch st.Code() {
	case codes.FailedPrecondition:
		sentinel = driver.ErrNotAcquired
	case codes.NotFound:
		sentinel = driver.ErrLeaseLost
	case codes.InvalidArgument:
		switch {
		case reason == "INVALID_KEY":
			sentinel = driver.ErrInvalidKey
		case reason == "INVALID_TTL":
			sentinel = driver.ErrInvalidTTL
		case strings.Contains(msg, "invalid holder"):
			sentinel = driver.ErrInvalidHolder
		default:
			sentinel = driver.ErrInvalidArgument
		}
	case codes.PermissionDenied, codes.Unauthenticated:
		sentinel = driver.ErrPermissionDenied
	case codes.OutOfRange, codes.AlreadyExists:
		sentinel = driver.ErrInvalidArgument
	case codes.ResourceExhausted:
		// gRPC's own size refusal carries no reason code; a server
		// answer's text can quote the caller's key, so it is never
		// matched as text.
		if reason == "REQUEST_TOO_LARGE" || (!isReasonCode(reason) && strings.Contains(msg, "larger than max")) {
			sentinel = driver.ErrInvalidArgument
		}
	}
	// TLS: a client certificate the server refused in the handshake is
	// driver.ErrPermissionDenied; a server certificate this Driver did not
	// accept is said plainly (tls.go).
	if sentinel == nil && !isReasonCode(reason) && st.Code() != codes.OK {
		if terr := tlsErr(op, msg); terr != nil {
			return terr
		}
	}
	// A TLS Driver dialling a plaintext port: a configuration error.
	if sentinel == nil && !isReasonCode(reason) && st.Code() != codes.OK && strings.Contains(msg, tlsNotServed) {
		return fmt.Errorf("%w: the server's port does not serve TLS: drop tls, ca, cert and key from the dlockd URL, or start dlockd with --tls-cert and --tls-key (gRPC: %s)",
			driver.ErrInvalidArgument, msg)
	}
	// A peer that is not dlockd shows only in the transport's text; a
	// dlockd answer (it ends with a reason code and may quote the key) is
	// never read that way.
	if sentinel == nil && !isReasonCode(reason) && st.Code() != codes.OK && notgrpc.Is(msg) {
		return fmt.Errorf("%w: the server does not speak the dlockd protocol (is it dlockd?); check the URL's port (gRPC: %s)",
			driver.ErrInvalidArgument, notgrpc.Detail(msg))
	}
	switch {
	case sentinel == driver.ErrNotAcquired || sentinel == driver.ErrLeaseLost:
		return sentinel // the root package adds the operation, key and store
	case sentinel == driver.ErrPermissionDenied && isReasonCode(reason):
		// dlockd's refusal names the identity, the key (or prefix) and
		// the missing permission; say it once: "permission denied:
		// identity "x" lacks lock on key "k"" (or "permission denied:
		// unauthenticated: unknown token ...").
		detail := strings.TrimSuffix(strings.TrimPrefix(msg, "dlockd: "), " ("+reason+")")
		detail = strings.TrimPrefix(detail, "permission denied: ")
		return fmt.Errorf("%w: %s", sentinel, detail)
	case sentinel != nil: // keep the server's detail (which limit)
		return fmt.Errorf("%w: the server refused the %s: %s", sentinel, op, strings.TrimPrefix(msg, "dlockd: "))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("dlockd %s: %w (%s: %s%s)", op, ctx.Err(), st.Code(), msg, tlsHint(msg))
	}
	return fmt.Errorf("dlockd %s: %s: %s%s", op, st.Code(), msg, tlsHint(msg))
}

// isReasonCode reports whether s looks like one of dlockd's reason codes
// (LOCK_HELD, NOT_LEADER, …): upper-case letters and underscores.
func isReasonCode(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && r != '_' {
			return false
		}
	}
	return true
}
